"""Forwards finished spans to RL-Insight, or to a fallback exporter when it is unusable."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge import rl_insight_compat
from verl_otel_bridge.accounting import SpanCounts
from verl_otel_bridge.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge.logs import OnceLogger, Reminder
from verl_otel_bridge.rl_insight_compat import Probe
from verl_otel_bridge.rl_insight_sessions import is_session_span, publish_session_gauges

logger = logging.getLogger("verl_otel_bridge.exporters.rl_insight")

#: Attributes added to every forwarded span, since RL-Insight's ``trace_span``
#: has no parameters for ids or status and re-creates each span as a root span.
TRACE_ID_ATTRIBUTE = "otel.trace_id"
SPAN_ID_ATTRIBUTE = "otel.span_id"
PARENT_SPAN_ID_ATTRIBUTE = "otel.parent_span_id"
STATUS_CODE_ATTRIBUTE = "otel.status_code"
STATUS_DESCRIPTION_ATTRIBUTE = "otel.status_description"


class RLInsightSpanExporter(SpanExporter):
    """A ``SpanExporter`` that calls ``rl_insight.trace_span`` for each span.

    RL-Insight is used only when it is *usable* (see
    :mod:`verl_otel_bridge.rl_insight_compat`): importable, ``__version__`` >=
    ``minimum_version``, ``trace_span`` callable, a server URL set and Ray
    initialised at export time. Then ``rl_insight.init`` runs once per process
    with the project and experiment name. Otherwise spans go to ``fallback``
    (a bounded in-memory exporter by default), one log line per reason says
    why, and :meth:`status` keeps saying it. A ``trace_span`` call that raises
    sends that span and the rest of its batch to the fallback. Nothing here
    raises into the caller.

    ``agent_session`` spans made by the bridge's sessions also publish RL-Insight's
    agent-loop dashboard gauges (see :mod:`verl_otel_bridge.rl_insight_sessions`);
    RL-Insight still receives exactly one ``agent_session`` span per session,
    with the session's real start and end.

    Args:
        fallback: where spans go when RL-Insight is unusable.
        minimum_version: the oldest RL-Insight forwarded to.
        project: passed to ``rl_insight.init``.
        experiment_name: passed to ``rl_insight.init``.
        init_config: passed as ``config=`` to ``rl_insight.init``.
        server_url: RL-Insight server; defaults to ``RL_INSIGHT_SERVER_URL``.
        explicit: RL-Insight was asked for by name, so being unusable is a
            WARNING; under ``auto`` it is an INFO.
        counts: where outcomes are counted (``exported.rl_insight``,
            ``fallback``, ``failed``); a private counter when None.
        fallback_name: how :meth:`status` names the fallback.
        reminder_interval_s: while unusable, a reminder is logged this often.
    """

    def __init__(
        self,
        fallback: SpanExporter | None = None,
        minimum_version: str = "0.3.0",
        *,
        project: str | None = None,
        experiment_name: str | None = None,
        init_config: Mapping[str, Any] | None = None,
        server_url: str | None = None,
        explicit: bool = True,
        counts: SpanCounts | None = None,
        fallback_name: str | None = None,
        reminder_interval_s: float = 600.0,
    ) -> None:
        self.fallback = fallback if fallback is not None else BoundedMemorySpanExporter()
        self.fallback_name = fallback_name or type(self.fallback).__name__
        self.minimum_version = minimum_version
        self.project = project
        self.experiment_name = experiment_name
        self.init_config = init_config
        self.server_url = server_url
        self.explicit = explicit
        self.counts = counts if counts is not None else SpanCounts()
        self._lock = threading.Lock()
        self._static: Probe | None = None
        self._last: Probe | None = None
        self._once = OnceLogger(logger)
        self._reminder = Reminder(logger, reminder_interval_s)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            probe = self.probe(initialize=True)
        except Exception as exc:  # noqa: BLE001 - a probe bug must not lose spans
            probe = Probe(False, "probe_failed", f"checking RL-Insight raised {type(exc).__name__}: {exc}")
            self._note_unusable(probe)
        if not probe.usable or probe.module is None:
            return self._to_fallback(spans)
        trace_span = probe.module.trace_span
        for index, span in enumerate(spans):
            if is_session_span(span):
                self._publish_gauges(probe, span)
            try:
                trace_span(
                    name=span.name,
                    start_time_ns=span.start_time,
                    end_time_ns=span.end_time,
                    attributes=forwarded_attributes(span),
                )
            except Exception as exc:  # noqa: BLE001
                self.counts.add("exported.rl_insight", index)
                self.counts.add("rl_insight_errors")
                self._once.log(
                    f"raised:{type(exc).__name__}",
                    logging.WARNING,
                    "rl_insight.trace_span raised %s: %s; that span and the rest of its batch (%d) go to the %s "
                    "exporter",
                    type(exc).__name__,
                    exc,
                    len(spans) - index,
                    self.fallback_name,
                )
                return self._to_fallback(spans[index:])
        self.counts.add("exported.rl_insight", len(spans))
        return SpanExportResult.SUCCESS

    def probe(self, *, initialize: bool = False) -> Probe:
        """Check RL-Insight now; with ``initialize``, also run ``rl_insight.init`` once if needed."""
        with self._lock:
            if self._static is None:
                self._static = rl_insight_compat.probe_module(self.minimum_version)
            static = self._static
        probe = rl_insight_compat.check_runtime(static, self.server_url)
        if initialize and probe.usable:
            probe = rl_insight_compat.ensure_initialized(
                probe, project=self.project, experiment_name=self.experiment_name, config=self.init_config
            )
        self._last = probe
        if not probe.usable:
            self._note_unusable(probe)
        return probe

    def status(self) -> dict[str, Any]:
        """Where spans go and why, RL-Insight's version, and the counters."""
        probe = self._last or self.probe()
        route = "rl_insight" if probe.usable else f"{self.fallback_name} (fallback)"
        return {
            "exporter": route,
            "reason": probe.reason,
            "detail": probe.detail,
            "rl_insight_version": probe.version,
            "rl_insight_installed": probe.installed,
            "counters": self.counts.snapshot(),
        }

    def _publish_gauges(self, probe: Probe, span: ReadableSpan) -> None:
        try:
            publish_session_gauges(probe.module, span)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - gauges are extra; the span still goes out
            self.counts.add("session_gauges_failed")
            self._once.log(
                f"gauges:{type(exc).__name__}",
                logging.WARNING,
                "agent-loop dashboard gauges not published (%s: %s); session spans are still forwarded",
                type(exc).__name__,
                exc,
            )
        else:
            self.counts.add("session_gauges_published")

    def _to_fallback(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.fallback.export(spans)
        except Exception:  # noqa: BLE001
            logger.exception("fallback exporter %s raised", self.fallback_name)
            result = SpanExportResult.FAILURE
        self.counts.add("fallback" if result is SpanExportResult.SUCCESS else "failed", len(spans))
        return result

    def _note_unusable(self, probe: Probe) -> None:
        level = logging.WARNING if self.explicit else logging.INFO
        first = self._once.log(
            probe.reason,
            level,
            "RL-Insight is not usable (%s): %s; spans go to the %s exporter instead",
            probe.reason,
            probe.detail,
            self.fallback_name,
        )
        if self._reminder.due() and not first:
            logger.log(
                level,
                "RL-Insight is still not usable (%s): %s; %d spans sent to the %s exporter so far",
                probe.reason,
                probe.detail,
                self.counts.get("fallback"),
                self.fallback_name,
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.fallback.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.fallback.shutdown()


def forwarded_attributes(span: ReadableSpan) -> dict[str, Any]:
    """The span's attributes plus its ids, status and first exception, as RL-Insight receives them."""
    attributes: dict[str, Any] = dict(span.attributes or {})
    context = span.get_span_context()
    if context is not None:
        attributes[TRACE_ID_ATTRIBUTE] = format(context.trace_id, "032x")
        attributes[SPAN_ID_ATTRIBUTE] = format(context.span_id, "016x")
    attributes[PARENT_SPAN_ID_ATTRIBUTE] = format(span.parent.span_id, "016x") if span.parent is not None else ""
    attributes[STATUS_CODE_ATTRIBUTE] = span.status.status_code.name
    if span.status.description:
        attributes[STATUS_DESCRIPTION_ATTRIBUTE] = span.status.description
    for event in span.events:
        if event.name == "exception" and event.attributes:
            for key in ("exception.type", "exception.message"):
                if key in event.attributes:
                    attributes.setdefault(key, event.attributes[key])
            break
    return attributes
