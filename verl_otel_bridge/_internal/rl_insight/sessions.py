"""Publishing a finished session's dashboard gauges through RL-Insight's agent-loop protocol.

RL-Insight 0.3.0's ``agent_loop_session(...).finish()`` publishes the Agent
Loop dashboard's gauges (``agent_loop_run_info``, ``_sample_info``,
``_session_info``, ``_traj_info``, first/last turn times) *and* sends an
``agent_session`` span timed at the moment ``finish()`` runs. The bridge needs
the gauges but must send the span itself, with the session's real start and
end, from its export thread. So it calls the protocol's gauge publisher,
``rl_insight.agent_loop._publish_agent_loop_session``, directly (see
:mod:`.private`). When a release lacks it, the gauges are skipped and
:func:`publish_session_gauges` says so.
"""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.protocol import SESSION_SPAN_NAME, TRACE_SOURCE, TRAJECTORIES
from verl_otel_bridge._internal.records import parse_json
from verl_otel_bridge._internal.rl_insight import private


def is_session_span(span: ReadableSpan) -> bool:
    """An ``agent_session`` span made by the bridge's session API."""
    attributes = span.attributes or {}
    return span.name == SESSION_SPAN_NAME and attributes.get(TRACE_SOURCE) == "session"


def publish_session_gauges(module: ModuleType, span: ReadableSpan) -> None:
    """Publish the dashboard gauges for one finished session span.

    Raises:
        LookupError: this RL-Insight has no agent-loop gauge publisher.
        Exception: whatever RL-Insight raises (the caller logs and goes on).
    """
    agent_loop = importlib.import_module(f"{module.__name__}.agent_loop")
    publish = private.gauge_publisher(agent_loop)
    if publish is None:
        raise LookupError(f"{module.__name__}.agent_loop has no {private.GAUGE_PUBLISHER}")
    attributes = span.attributes or {}
    global_steps: Any = attributes.get("global_steps", "")
    publish(
        experiment_name=attributes.get("experiment_name", ""),
        sample=attributes.get("sample", ""),
        session=attributes.get("session", ""),
        trajectories=_trajectories(attributes.get(TRAJECTORIES)),
        global_steps=None if global_steps == "" else global_steps,
        start_time_ns=span.start_time,
        end_time_ns=span.end_time,
    )


def _trajectories(encoded: Any) -> list[SimpleNamespace]:
    if not isinstance(encoded, str):
        return []
    try:
        items = parse_json(encoded)
    except ValueError:
        return []
    return [SimpleNamespace(**item) for item in items if isinstance(item, dict)]
