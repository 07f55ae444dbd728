"""The verl plugin's wrappers over bare OpenTelemetry spans: the ``sdk`` arm of ``bench/verl_overhead.py``.

:class:`BareSdkBridge` answers what the plugin's wrappers ask of a bridge (``session``,
``task``, ``turn``, ``clean_attributes``, ``flush_queued``, ``config``, ``enabled``) with
the plainest OpenTelemetry code a user would write: ``tracer.start_as_current_span``
with the identity written on every span, ``span.set_attributes``, a
``BatchSpanProcessor`` and an exporter that does nothing. Made current in place of
the bridge, the plugin records the same spans at the same points of verl's code,
so ``on`` against ``sdk`` is what the bridge itself costs over OpenTelemetry's own
spans inside verl, and ``sdk`` against ``unset`` is the floor any SDK-based tracer
pays there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span

from verl_otel_bridge import BridgeConfig

_identity: ContextVar[Mapping[str, Any]] = ContextVar("bare_sdk_identity", default=MappingProxyType({}))


class _Counting(SpanExporter):
    """Does nothing with the spans but count them, so the bench can check the arm made them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as a user would hand them to ``set_attributes``: None left out, mappings as JSON."""
    return {k: json.dumps(v) if isinstance(v, Mapping) else v for k, v in values.items() if v is not None}


class _Handle:
    def __init__(self, span: Span) -> None:
        self.span = span

    def set_result(self, **values: Any) -> None:
        self.span.set_attributes(_plain(values))

    def record(self, **values: Any) -> None:
        self.span.set_attributes(_plain(values))


class _Session:
    def __init__(self, span: Span, identity: dict[str, Any]) -> None:
        self.span = span
        self.identity = identity

    def finish(self, *, status: str, trajectories: Sequence[Any] = (), **values: Any) -> None:
        self.span.set_attributes(_plain({"status": status, "trajectories": json.dumps(list(trajectories)), **values}))


class BareSdkBridge:
    """What the verl plugin's wrappers use of a bridge, over bare OpenTelemetry spans (see the module doc)."""

    enabled = True
    retired = False

    def __init__(self) -> None:
        self.config = BridgeConfig.resolve(environ={}, exporter="none")
        self.provider = TracerProvider()
        self.exported = _Counting()
        self.provider.add_span_processor(BatchSpanProcessor(self.exported))
        self.tracer = self.provider.get_tracer("bare-sdk")

    def clean_attributes(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return _plain(values)

    @contextmanager
    def session(self, **fields: Any) -> Iterator[_Session]:
        lane = f"experiment={fields['experiment_name']}/sample={fields['sample']}/session={fields['session']}/traj=0"
        identity = {
            "project": fields.get("project") or "",
            "experiment_name": str(fields["experiment_name"]),
            "sample": str(fields["sample"]),
            "session": str(fields["session"]),
            "traj": "0",
            "state_lane_id": lane,
            "uid": str(fields.get("uid") or ""),
            "global_steps": fields["global_steps"],
        }
        with self.tracer.start_as_current_span("agent_session", attributes=identity) as span:
            token = _identity.set(identity)
            try:
                yield _Session(span, identity)
            finally:
                _identity.reset(token)

    @contextmanager
    def task(self, name: str) -> Iterator[_Handle]:
        with self.tracer.start_as_current_span("agent_task", attributes={**_identity.get(), "task_name": name}) as span:
            yield _Handle(span)

    @contextmanager
    def turn(self, turn: int, *, type: str = "generate") -> Iterator[_Handle]:
        attributes = {**_identity.get(), "turn": turn, "type": type}
        with self.tracer.start_as_current_span("agent_turn", attributes=attributes) as span:
            yield _Handle(span)

    def flush_queued(self, timeout_s: float = 5.0, *, wait_for_network: bool = True) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()
