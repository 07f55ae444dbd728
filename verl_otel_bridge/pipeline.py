"""From a :class:`BridgeConfig` to the exporter chain and the processors that feed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge.accounting import SpanCounts
from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.export_queue import QueueSettings
from verl_otel_bridge.exporters import (
    BoundedMemorySpanExporter,
    CountingSpanExporter,
    DiscardSpanExporter,
    JsonlSpanExporter,
    RLInsightSpanExporter,
    console_exporter,
)


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
    queue = QueueSettings(
        max_size=config.max_queue_size,
        batch_size=config.max_export_batch_size,
        delay_s=config.schedule_delay_ms / 1000,
    )
    wants_rl_insight = config.exporter == "rl_insight" or (
        config.exporter == "auto" and config.rl_insight_enable is not False
    )
    if wants_rl_insight:
        local = _local_exporter(config.fallback, config)
        rl_insight = RLInsightSpanExporter(
            fallback=local,
            minimum_version=config.rl_insight_min_version,
            project=config.project,
            experiment_name=config.experiment_name,
            init_config=config.rl_insight_config,
            server_url=config.rl_insight_server_url,
            explicit=config.exporter == "rl_insight" or config.rl_insight_enable is True,
            counts=counts,
            fallback_name=config.fallback,
        )
        return Pipeline(rl_insight, _memory(local), rl_insight, queue, {})
    name = config.fallback if config.exporter == "auto" else config.exporter
    why = (
        f"exporter=auto with rl_insight_enable=false (VERL_RL_INSIGHT_ENABLE=0, or a verl config whose trainer.logger lacks rl_insight), so {name!r}"
        if config.exporter == "auto"
        else f"exporter={name!r} configured"
    )
    local = _local_exporter(name, config)
    inline = name in ("memory", "none")
    route = {"exporter": name, "reason": "configured", "detail": why, "rl_insight_version": None}
    return Pipeline(CountingSpanExporter(local, counts, f"exported.{name}"), _memory(local), None, None if inline else queue, route)


def _local_exporter(name: str, config: BridgeConfig) -> SpanExporter:
    if name == "memory":
        return BoundedMemorySpanExporter(config.memory_max_spans)
    if name == "jsonl":
        return JsonlSpanExporter(config.jsonl_path)
    if name == "console":
        return console_exporter()
    return DiscardSpanExporter()


def _memory(exporter: SpanExporter) -> BoundedMemorySpanExporter | None:
    return exporter if isinstance(exporter, BoundedMemorySpanExporter) else None
