"""From a :class:`BridgeConfig` to the exporter chain and the processors that feed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge.accounting import SpanCounts
from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.export_queue import QueueSettings
from verl_otel_bridge.exporters.counting import CountingSpanExporter
from verl_otel_bridge.exporters.fanout import FanOutSpanExporter
from verl_otel_bridge.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge.exporters.named import INLINE, named_exporter
from verl_otel_bridge.exporters.redacting import RedactingSpanExporter
from verl_otel_bridge.exporters.rl_insight import RLInsightSpanExporter


@dataclass
class Pipeline:
    """The exporter chain a bridge uses and how to describe it.

    Attributes:
        exporter: the top of the chain, handed every ended span.
        memory: the in-memory exporter in the chain (primary or fallback), if any.
        rl_insight: the RL-Insight exporter, when RL-Insight is wanted.
        queue: export-queue bounds, or None to export inline (no-I/O exporters).
        route: where spans go and why, for ``status()`` when RL-Insight is not involved.
    """

    exporter: SpanExporter
    memory: BoundedMemorySpanExporter | None
    rl_insight: RLInsightSpanExporter | None
    queue: QueueSettings | None
    route: dict[str, Any]


def build_pipeline(config: BridgeConfig, counts: SpanCounts) -> Pipeline:
    """Build the exporter chain for ``config``; raises ``ValueError`` for unusable settings."""
    primary, *others = config.exporters
    pipeline = _primary(primary, config, counts)
    if others:
        copies = {name: named_exporter(name, config) for name in others}
        pipeline.exporter = FanOutSpanExporter(pipeline.exporter, copies, counts)
        pipeline.memory = pipeline.memory or next(
            (e for e in copies.values() if isinstance(e, BoundedMemorySpanExporter)), None
        )
        if not INLINE.issuperset(others):
            pipeline.queue = _queue(config)
    if config.redact_attributes:
        pipeline.exporter = RedactingSpanExporter(pipeline.exporter, config.redact_attributes)
    return pipeline


def _primary(name: str, config: BridgeConfig, counts: SpanCounts) -> Pipeline:
    if name == "rl_insight" or (name == "auto" and config.rl_insight_enable is not False):
        rl_insight = RLInsightSpanExporter(
            config=config,
            explicit=name == "rl_insight" or config.rl_insight_enable is True,
            counts=counts,
        )
        return Pipeline(rl_insight, _memory(rl_insight.fallback), rl_insight, _queue(config), {})
    local_name = config.fallback if name == "auto" else name
    why = (
        "exporter=auto with rl_insight_enable=false (VERL_RL_INSIGHT_ENABLE=0, or a verl config whose "
        f"trainer.logger lacks rl_insight), so {local_name!r}"
        if name == "auto"
        else f"exporter={local_name!r} configured"
    )
    local = named_exporter(local_name, config)
    route = {"exporter": local_name, "reason": "configured", "detail": why, "rl_insight_version": None}
    queue = None if local_name in INLINE else _queue(config)
    return Pipeline(CountingSpanExporter(local, counts, f"exported.{local_name}"), _memory(local), None, queue, route)


def _queue(config: BridgeConfig) -> QueueSettings:
    return QueueSettings(
        max_size=config.max_queue_size,
        batch_size=config.max_export_batch_size,
        delay_s=config.schedule_delay_ms / 1000,
    )


def _memory(exporter: SpanExporter) -> BoundedMemorySpanExporter | None:
    return exporter if isinstance(exporter, BoundedMemorySpanExporter) else None
