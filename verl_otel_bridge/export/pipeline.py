"""From a :class:`BridgeConfig` to the exporter chain and the processors that feed it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge.accounting import SpanCounts, copied, exported
from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.export.queue import QueueSettings
from verl_otel_bridge.export.route import Route
from verl_otel_bridge.export.sampling import SamplingSettings, SessionSampler
from verl_otel_bridge.export.spill import Spill, SpillingSpanExporter, SpillSettings
from verl_otel_bridge.exporters.base import exporter_report
from verl_otel_bridge.exporters.counting import CountingSpanExporter
from verl_otel_bridge.exporters.fanout import FanOutSpanExporter
from verl_otel_bridge.exporters.kinds import inline, named_exporter
from verl_otel_bridge.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge.exporters.redacting import RedactingSpanExporter

if TYPE_CHECKING:
    from verl_otel_bridge.rl_insight.exporter import RLInsightSpanExporter


@dataclass
class Pipeline:
    """The exporter chain a bridge uses and how to describe it.

    Attributes:
        exporter: the top of the chain, handed every ended span.
        memory: the in-memory exporter in the chain (primary or fallback), if any.
        rl_insight: the RL-Insight exporter, when RL-Insight is wanted.
        queue: export-queue bounds, or None to export inline (no-I/O exporters).
        route: where the config sends spans and why.
        destinations: each configured exporter by name, the primary first.
        spill: the spill files, when spans are queued and spilling is on.
        sampler: the session sampler, when ``session_sample_rate`` is below 1.
    """

    exporter: SpanExporter
    memory: BoundedMemorySpanExporter | None
    rl_insight: RLInsightSpanExporter | None
    queue: QueueSettings | None
    route: Route
    destinations: dict[str, SpanExporter] = field(default_factory=dict)
    spill: Spill | None = None
    sampler: SessionSampler | None = None

    def report(self, counters: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Per destination: its role, ``endpoint``, ``last_error``, the spans it accepted and refused,
        and those spilled to be sent again (only the primary spills)."""
        report: dict[str, dict[str, Any]] = {}
        for index, (name, exporter) in enumerate(self.destinations.items()):
            if index == 0:
                exported = counters["exported"]
                entry: dict[str, Any] = {
                    "role": "primary",
                    "exported": sum(exported.values()) if exporter is self.rl_insight else exported.get(name, 0),
                    "failed": counters["failed"],
                    "spilled": counters["spilled"],
                }
            else:
                entry = {
                    "role": "copy",
                    "exported": counters.get(copied(name), 0),
                    "failed": counters.get(copied(name, ok=False), 0),
                    "spilled": 0,
                }
            if self.rl_insight is not None and exporter is self.rl_insight:
                status = self.rl_insight.status()
                entry.update(endpoint=status["otlp_endpoint"], last_error=status["otlp_error"])
            else:
                entry.update(exporter_report(exporter))
            report[name] = entry
        return report


def build_pipeline(config: BridgeConfig, counts: SpanCounts) -> Pipeline:
    """Build the exporter chain for ``config``; raises ``ValueError`` for unusable settings."""
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
    if config.redact_attributes:
        pipeline.exporter = RedactingSpanExporter(pipeline.exporter, config.redact_attributes)
    return pipeline


def _queued(route: Route) -> bool:
    """Whether spans of ``route`` go through the export queue (some exporter does I/O)."""
    return route.wants_rl_insight or not inline(route.names)


def _primary(route: Route, config: BridgeConfig, counts: SpanCounts, spill: Spill | None) -> Pipeline:
    if route.wants_rl_insight:
        # Loaded only here, so a bridge that does not want RL-Insight never imports its modules.
        from verl_otel_bridge.rl_insight.exporter import RLInsightSpanExporter

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
