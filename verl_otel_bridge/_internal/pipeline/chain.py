"""From a :class:`BridgeConfig` to the exporter chain and the processors that feed it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge._internal.accounting import SpanCounts, balance, copied, exported
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.base import exporter_report
from verl_otel_bridge._internal.exporters.counting import CountingSpanExporter
from verl_otel_bridge._internal.exporters.fanout import FanOutSpanExporter
from verl_otel_bridge._internal.exporters.kinds import inline, named_exporter, network
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.exporters.redacting import with_redaction
from verl_otel_bridge._internal.pipeline.processors import ExportSpanProcessor
from verl_otel_bridge._internal.pipeline.queue import QueueSettings
from verl_otel_bridge._internal.pipeline.route import Route
from verl_otel_bridge._internal.pipeline.sampling import SamplingSettings, SessionSampler
from verl_otel_bridge._internal.pipeline.spill import Spill, SpillingSpanExporter, SpillSettings
from verl_otel_bridge._internal.status import (
    BridgeStatus,
    Endpoint,
    ExporterStatus,
    OpenSessionsStatus,
    PendingStatus,
    rl_insight_installed,
)

if TYPE_CHECKING:
    from verl_otel_bridge._internal.rl_insight.compat import Probe
    from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter

logger = logging.getLogger(__name__)


@dataclass
class Pipeline:
    """The exporter chain a bridge uses, the processor that feeds it, and its status.

    Attributes:
        exporter: the top of the chain, handed every ended span.
        memory: the in-memory exporter in the chain (primary or fallback), if any.
        rl_insight: the RL-Insight exporter, when RL-Insight is wanted.
        queue: export-queue bounds, or None to export inline (no-I/O exporters).
        route: where the config sends spans and why.
        destinations: each configured exporter by name, the primary first.
        spill: the spill files, when spans are queued and spilling is on.
        sampler: the session sampler, when ``session_sample_rate`` is below 1.
        processor: the span processor that counts spans and hands them to ``exporter``.
    """

    exporter: SpanExporter
    memory: BoundedMemorySpanExporter | None
    rl_insight: RLInsightSpanExporter | None
    queue: QueueSettings | None
    route: Route
    destinations: dict[str, SpanExporter] = field(default_factory=dict)
    spill: Spill | None = None
    sampler: SessionSampler | None = None
    processor: ExportSpanProcessor = field(init=False)

    def exporters(self, counters: dict[str, Any]) -> dict[str, ExporterStatus]:
        """Per destination, the primary first, then the RL-Insight fallback and the copies: its role,
        ``endpoint``, ``last_error``, the spans it accepted and refused, and those spilled to be sent
        again (only the primary spills)."""
        report: dict[str, ExporterStatus] = {}
        for index, (name, exporter) in enumerate(self.destinations.items()):
            if index == 0:
                exported = counters["exported"]
                report[name] = {
                    "role": "primary",
                    "exported": sum(exported.values()) if exporter is self.rl_insight else exported.get(name, 0),
                    "failed": counters["failed"],
                    "spilled": counters["spilled"],
                    **self._where(exporter),
                }
                if self.rl_insight is not None:
                    fallback = self.rl_insight.fallback_name
                    key = fallback if fallback not in self.destinations else f"{fallback} (fallback)"
                    report[key] = {
                        "role": "fallback",
                        "exported": counters["fallback"],
                        "failed": 0,
                        "spilled": 0,
                        **self._where(self.rl_insight.fallback),
                    }
            else:
                report[name] = {
                    "role": "copy",
                    "exported": counters.get(copied(name), 0),
                    "failed": counters.get(copied(name, ok=False), 0),
                    "spilled": 0,
                    **self._where(exporter),
                }
        return report

    def _where(self, exporter: SpanExporter) -> Endpoint:
        if self.rl_insight is not None and exporter is self.rl_insight:
            route = self.rl_insight.status()
            return {"endpoint": route["otlp_endpoint"], "last_error": route["otlp_error"]}
        return exporter_report(exporter)

    def status(self, counters: dict[str, Any], open_sessions: OpenSessionsStatus) -> BridgeStatus:
        """Where spans go and why, each destination's count, what is pending and where to, the spill."""
        if self.rl_insight is not None:
            route = self.rl_insight.status()
            exporter, reason, detail = route["exporter"], route["reason"], route["detail"]
            rl_insight = {key: route[key] for key in _RL_INSIGHT_KEYS}
        else:
            exporter, reason, detail = self.route.local, "configured", self.route.why
            rl_insight = {**dict.fromkeys(_RL_INSIGHT_KEYS), "rl_insight_installed": rl_insight_installed()}
        exporters = self.exporters(counters)
        otlp = exporters.get("otlp")
        if otlp is not None and rl_insight["otlp_endpoint"] is None:
            rl_insight.update(otlp_endpoint=otlp["endpoint"], otlp_error=otlp["last_error"])
        queue = self.processor.queue
        spill = self.spill.status() if self.spill is not None else None
        pending: PendingStatus = {
            "queued": len(queue) if queue is not None else 0,
            "bytes": queue.bytes if queue is not None else 0,
            "spilled": spill["backlog"] if spill is not None else 0,
            "to": exporter,
        }
        return {
            "enabled": True,
            "exporter": exporter,
            "reason": reason,
            "detail": detail,
            **rl_insight,  # type: ignore[typeddict-item]
            "counters": counters,
            "exporters": exporters,
            "pending": pending,
            "queued": pending["queued"],
            "queued_bytes": pending["bytes"],
            "spill": spill,
            "open_sessions": open_sessions,
        }

    def rl_insight_probe(self, *, initialize: bool = False) -> Probe | None:
        """Check RL-Insight as its exporter does (None when RL-Insight is not wanted); with ``initialize``,
        also run ``rl_insight.init`` once per process if it is usable."""
        return self.rl_insight.probe(initialize=initialize) if self.rl_insight is not None else None

    def log_summary(self, status: BridgeStatus) -> None:
        """The shutdown line: where spans went and every counter; WARNING if spans were dropped, failed or
        unaccounted for, or went to the fallback although RL-Insight was asked for by name, else INFO."""
        counters = status["counters"]
        preferred_unusable = self.rl_insight is not None and self.rl_insight.explicit and status["reason"] != "ok"
        worrying = (
            counters["dropped"]
            or counters["failed"]
            or balance(counters)  # spans ended but never written nor counted anywhere
            or (counters["fallback"] and preferred_unusable)
        )
        logger.log(
            logging.WARNING if worrying else logging.INFO,
            "verl_otel_bridge shut down: spans went to %s (%s); started=%d ended=%d exported=%s fallback=%d "
            "spilled=%d sampled_out=%d dropped=%d failed=%d invalid=%d unaccounted=%d",
            status["exporter"],
            status["detail"],
            counters["started"],
            counters["ended"],
            counters["exported"],
            counters["fallback"],
            counters["spilled"],
            counters["sampled_out"],
            counters["dropped"],
            counters["failed"],
            counters["invalid"],
            balance(counters),
        )


#: The ``status()`` keys RL-Insight's exporter fills in (None when RL-Insight is not wanted).
_RL_INSIGHT_KEYS = (
    "rl_insight_installed",
    "rl_insight_version",
    "rl_insight_package_version",
    "rl_insight_transport",
    "otlp_endpoint",
    "otlp_error",
)


def disabled_status(config: BridgeConfig, counters: dict[str, Any], open_sessions: OpenSessionsStatus) -> BridgeStatus:
    """``status()`` of a bridge that traces nothing (``config`` has ``enabled=False``): it has no pipeline."""
    return {
        "enabled": False,
        "exporter": "none",
        "reason": "disabled",
        "detail": Route.of(config).why,
        "rl_insight_installed": rl_insight_installed(),
        "rl_insight_version": None,
        "rl_insight_package_version": None,
        "rl_insight_transport": None,
        "otlp_endpoint": None,
        "otlp_error": None,
        "counters": counters,
        "exporters": {},
        "pending": {"queued": 0, "bytes": 0, "spilled": 0, "to": "none"},
        "queued": 0,
        "queued_bytes": 0,
        "spill": None,
        "open_sessions": open_sessions,
    }


def build_pipeline(config: BridgeConfig, counts: SpanCounts) -> Pipeline:
    """Build the exporter chain and its processor for ``config``; raises ``ValueError`` for unusable settings."""
    route = Route.of(config)
    settings = SpillSettings.of(config)
    spill = Spill(settings, counts) if settings is not None and _queued(route) else None
    pipeline = _primary(route, config, counts, spill)
    pipeline.spill = spill
    sampling = SamplingSettings.of(config)
    pipeline.sampler = SessionSampler(sampling, counts) if sampling is not None else None
    others = route.copies
    if others:
        copies = {name: named_exporter(name, config) for name in others}
        pipeline.destinations.update(copies)
        pipeline.exporter = FanOutSpanExporter(pipeline.exporter, copies, counts)
        pipeline.memory = pipeline.memory or next(
            (e for e in copies.values() if isinstance(e, BoundedMemorySpanExporter)), None
        )
        if not inline(others):
            pipeline.queue = _queue(config)
    pipeline.exporter = with_redaction(pipeline.exporter, config.redact_attributes)
    pipeline.processor = ExportSpanProcessor(
        pipeline.exporter,
        counts,
        pipeline.queue,
        spill,
        pipeline.sampler,
        network=route.wants_rl_insight or network(route.names),
    )
    return pipeline


def _queued(route: Route) -> bool:
    """Whether spans of ``route`` go through the export queue (some exporter does I/O)."""
    return route.wants_rl_insight or not inline(route.names)


def _primary(route: Route, config: BridgeConfig, counts: SpanCounts, spill: Spill | None) -> Pipeline:
    if route.wants_rl_insight:
        # Loaded only here, so a bridge that does not want RL-Insight never imports its modules.
        from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter

        rl_insight = RLInsightSpanExporter(config=config, explicit=route.explicit, counts=counts)
        rl_insight.start_probe()
        return Pipeline(
            rl_insight, _memory(rl_insight.fallback), rl_insight, _queue(config), route, {"rl_insight": rl_insight}
        )
    local = named_exporter(route.local, config)
    key = exported(route.local)
    destinations: dict[str, SpanExporter] = {route.local: local}
    if inline((route.local,)):
        return Pipeline(CountingSpanExporter(local, counts, key), _memory(local), None, None, route, destinations)
    counted = (
        SpillingSpanExporter(local, counts, key, spill)
        if spill is not None
        else CountingSpanExporter(local, counts, key)
    )
    return Pipeline(counted, _memory(local), None, _queue(config), route, destinations)


def _queue(config: BridgeConfig) -> QueueSettings:
    return QueueSettings(
        max_size=config.max_queue_size,
        batch_size=config.max_export_batch_size,
        delay_s=config.schedule_delay_ms / 1000,
        max_bytes=config.max_queue_bytes,
    )


def _memory(exporter: SpanExporter) -> BoundedMemorySpanExporter | None:
    return exporter if isinstance(exporter, BoundedMemorySpanExporter) else None
