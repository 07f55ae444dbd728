"""The bridge's export side built from a :class:`BridgeConfig` by constructors: destinations, chain, queue,
processor; and the one builder of ``status()``.

A disabled bridge has a pipeline too, with no destination: its status comes from the
same builder.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from verl_otel_bridge._internal.accounting import (
    DISCARDED,
    DROPPED,
    FAILED,
    FALLBACK,
    SPILLED,
    SpanCounts,
    balance,
    copied,
)
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporter_names import NAMES, destination_module
from verl_otel_bridge._internal.pipeline.chain import ExportChain, Named
from verl_otel_bridge._internal.pipeline.processors import ExportSpanProcessor
from verl_otel_bridge._internal.pipeline.queue import ExportQueue
from verl_otel_bridge._internal.pipeline.route import Route
from verl_otel_bridge._internal.pipeline.sampling import SamplingSettings, SessionSampler
from verl_otel_bridge._internal.pipeline.spill import SpillSettings
from verl_otel_bridge._internal.status import (
    BridgeStatus,
    ExporterStatus,
    OpenSessionsStatus,
    PendingStatus,
    rl_insight_installed,
)

if TYPE_CHECKING:  # RL-Insight's modules load only for a bridge that wants RL-Insight
    from verl_otel_bridge._internal.rl_insight.exporter import RLInsightDestination

logger = logging.getLogger(__name__)

#: The ``status()`` keys RL-Insight's destination fills in (None when RL-Insight is not wanted).
RL_INSIGHT_KEYS = ("rl_insight_version", "rl_insight_package_version", "rl_insight_transport")


class Pipeline:
    """Where ended spans go, as ``config`` says.

    Attributes:
        route: where the config sends spans and why.
        chain: the export chain (None when tracing is disabled).
        queue: the export queue, None when spans are exported inline (no destination does I/O).
        sampler: the session sampler, when ``session_sample_rate`` is below 1.
        processor: the span processor that counts spans and hands them on (None when disabled).
        rl_insight: RL-Insight's destination, when RL-Insight is wanted.
        shut_down: the pipeline was shut down; its figures are final.
    """

    def __init__(self, config: BridgeConfig, counts: SpanCounts) -> None:
        self.config = config
        self.route = route = Route.of(config)
        self.chain: ExportChain | None = None
        self.queue: ExportQueue | None = None
        self.processor: ExportSpanProcessor | None = None
        self.rl_insight: RLInsightDestination | None = None
        self.shut_down = False
        sampling = SamplingSettings.of(config)
        self.sampler = SessionSampler(sampling, counts) if sampling is not None and config.enabled else None
        if not config.enabled:
            return
        local = _named(route.local, config, counts)
        if route.wants_rl_insight:
            primary, fallback = _named("rl_insight", config, counts), local
            self.rl_insight = cast("RLInsightDestination", primary.destination)
        else:
            primary, fallback = local, None
        queued = route.wants_rl_insight or not all(NAMES[name].inline for name in route.names)
        self.chain = ExportChain(
            primary,
            counts,
            copies=[_named(name, config, counts) for name in route.copies],
            fallback=fallback,
            redact_keys=config.redact_attributes,
            spill=SpillSettings.of(config) if queued else None,
        )
        if queued:
            self.queue = ExportQueue(
                self.chain.export,
                max_bytes=config.max_queue_bytes,
                max_spans=config.max_queue_size,
                batch_size=config.max_export_batch_size,
                delay_s=config.schedule_delay_ms / 1000,
                # A batch counted as dropped at shutdown was exported (and counted) after all.
                on_late_batch=lambda spans: counts.add(DROPPED, -spans),
            )
        network = route.wants_rl_insight or any(NAMES[name].network for name in route.names)
        self.processor = ExportSpanProcessor(self.chain, counts, self.queue, self.sampler, network=network)

    def shutdown(self, timeout_s: float) -> None:
        """Export or spill what is pending and close the destinations, within ``timeout_s``."""
        if self.processor is not None:
            self.processor.shutdown(timeout_s)
        self.shut_down = True

    # -- status -------------------------------------------------------------------------

    def status(self, counters: dict[str, Any], open_sessions: OpenSessionsStatus) -> BridgeStatus:
        """Where spans go and why, each destination's count and place, what is pending and where to, the spill."""
        rl_insight: dict[str, Any] = dict.fromkeys(RL_INSIGHT_KEYS)
        if self.rl_insight is not None:
            route = self.rl_insight.status()
            exporter, reason, detail = route["exporter"], route["reason"], route["detail"]
            installed = route["rl_insight_installed"]
            rl_insight.update({key: route[key] for key in RL_INSIGHT_KEYS})
        else:
            enabled = self.config.enabled
            exporter = self.route.local if enabled else "none"
            reason, detail = ("configured" if enabled else "disabled"), self.route.why
            installed = rl_insight_installed()
        queue, chain = self.queue, self.chain
        spill = chain.spill.status() if chain is not None and chain.spill is not None else None
        pending: PendingStatus = {
            "queued": len(queue) if queue is not None else 0,
            "bytes": queue.bytes if queue is not None else 0,
            "spilled": spill["backlog"] if spill is not None else 0,
            "to": exporter,
        }
        return {
            "enabled": self.config.enabled,
            "exporter": exporter,
            "reason": reason,
            "detail": detail,
            "rl_insight_installed": installed,
            **rl_insight,  # type: ignore[typeddict-item]
            "counters": counters,
            "exporters": self._exporters(counters),
            "pending": pending,
            "spill": spill,
            "open_sessions": open_sessions,
            "shut_down": self.shut_down,
        }

    def _exporters(self, counters: dict[str, Any]) -> dict[str, ExporterStatus]:
        """Per destination, the primary first, then the fallback and the copies: its role, where it writes,
        its last error, the spans it took, refused, spilled (only the primary spills) and discarded."""
        chain = self.chain
        if chain is None:
            return {}
        taken = counters["exported"]
        primary = chain.primary
        report: dict[str, ExporterStatus] = {
            primary.name: {
                "role": "primary",
                "exported": sum(taken.values())
                if primary.destination is self.rl_insight
                else taken.get(primary.name, 0),
                "failed": counters[FAILED],
                "spilled": counters[SPILLED],
                "discarded": counters[DISCARDED] if primary.discards else 0,
                **primary.destination.where(),
            }
        }
        if chain.fallback is not None:
            fallback = chain.fallback
            copies = {named.name for named in chain.copies}
            key = fallback.name if fallback.name not in copies else f"{fallback.name} (fallback)"
            report[key] = {
                "role": "fallback",
                "exported": 0 if fallback.discards else counters[FALLBACK],
                "failed": 0,
                "spilled": 0,
                "discarded": counters[DISCARDED] if fallback.discards else 0,
                **fallback.destination.where(),
            }
        for named in chain.copies:
            report[named.name] = {
                "role": "copy",
                "exported": counters.get(copied(named.name), 0),
                "failed": counters.get(copied(named.name, ok=False), 0),
                "spilled": 0,
                "discarded": 0,
                **named.destination.where(),
            }
        return report

    def log_summary(self, status: BridgeStatus) -> None:
        """The shutdown line: where spans went and every counter; WARNING if spans were dropped, failed or are
        unaccounted for, or went to the fallback although RL-Insight was asked for by name, else INFO."""
        counters = status["counters"]
        unaccounted = balance(counters)
        preferred_unusable = self.rl_insight is not None and self.route.explicit and status["reason"] != "ok"
        worrying = (
            counters["dropped"] or counters["failed"] or unaccounted or (counters["fallback"] and preferred_unusable)
        )
        logger.log(
            logging.WARNING if worrying else logging.INFO,
            "verl_otel_bridge shut down: spans went to %s (%s); started=%d ended=%d exported=%s fallback=%d "
            "spilled=%d sampled_out=%d discarded=%d dropped=%d failed=%d invalid=%d unaccounted=%d",
            status["exporter"],
            status["detail"],
            counters["started"],
            counters["ended"],
            counters["exported"],
            counters["fallback"],
            counters["spilled"],
            counters["sampled_out"],
            counters["discarded"],
            counters["dropped"],
            counters["failed"],
            counters["invalid"],
            unaccounted,
        )


def _named(name: str, config: BridgeConfig, counts: SpanCounts) -> Named:
    """Destination ``name`` built from ``config`` (:mod:`verl_otel_bridge._internal.exporter_names`)."""
    return Named(name, destination_module(name).build(config, counts), NAMES[name].discards)
