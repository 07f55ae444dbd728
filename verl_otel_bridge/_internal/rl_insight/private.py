"""Every private RL-Insight name the bridge relies on, each read defensively (a missing one is None).

RL-Insight 0.3.0 offers no public way to tell whether ``init`` succeeded, to reach
the hub actor ``trace_span`` sends to, or to publish a session's dashboard gauges
without also sending a span timed at that moment. The bridge reads these:

- ``rl_insight.api._STATE.enabled``: whether ``init`` left monitoring on
  (missing: "cannot tell", init assumed to have worked);
- ``rl_insight.api._STATE.labels`` and ``.namespace``: what the hub adds, for the otlp
  transport (missing: the bridge's own project, experiment and the default namespace);
- ``rl_insight.api._STATE.client._actor``: asking the hub whether it took a batch
  (missing: batches are not confirmed);
- ``rl_insight.agent_loop._publish_agent_loop_session``: the Agent Loop dashboard's
  gauges (missing: gauges skipped, counted ``session_gauges_failed``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

STATE = "_STATE"
CLIENT_ACTOR = "_actor"
GAUGE_PUBLISHER = "_publish_agent_loop_session"


def state(module: Any) -> Any:
    """RL-Insight's per-process state (``rl_insight.api._STATE``: enabled, labels, namespace, client), or None."""
    if module is None:
        return None
    return getattr(sys.modules.get(f"{getattr(module, '__name__', '')}.api"), STATE, None)


def monitoring_enabled(module: Any) -> bool | None:
    """Whether RL-Insight's own state says monitoring is on (None: cannot tell)."""
    enabled = getattr(state(module), "enabled", None)
    return enabled if isinstance(enabled, bool) else None


def hub_actor(module: Any) -> Any:
    """The Ray actor handle ``rl_insight.trace_span`` sends to, or None."""
    actor = getattr(getattr(state(module), "client", None), CLIENT_ACTOR, None)
    return actor if actor is not None and hasattr(actor, "get_status") else None


def gauge_publisher(agent_loop: Any) -> Callable[..., Any] | None:
    """``rl_insight.agent_loop._publish_agent_loop_session``, or None."""
    publish = getattr(agent_loop, GAUGE_PUBLISHER, None)
    return publish if callable(publish) else None
