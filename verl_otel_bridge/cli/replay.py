"""``verl-otel-bridge replay``: re-export captures with their original ids and times."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import FAILED, FALLBACK, SpanCounts
from verl_otel_bridge._internal.assembly import Pipeline
from verl_otel_bridge._internal.captures.read import MAX_LISTED, CaptureRecords
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.pipeline.chain import ExportChain
from verl_otel_bridge._internal.records import record_to_span
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge._version import distribution_version

# -- replay ----------------------------------------------------------------------


@dataclass
class ReplaySummary:
    """Outcome of :func:`replay_records`: every span read lands in exactly one of exported, fallback, failed.

    ``bad`` names the first bad lines (``(file, line, problem)``; ``bad_lines`` counts them all),
    ``empty`` the files that held no span record, with why.
    """

    read: int = 0
    bad: list[tuple[str, int, str]] = field(default_factory=list)
    bad_lines: int = 0
    empty: list[tuple[str, str]] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def exported(self) -> int:
        return int(sum(self.counters.get("exported", {}).values()))

    @property
    def fallback(self) -> int:
        return int(self.counters.get(FALLBACK, 0))

    @property
    def failed(self) -> int:
        return int(self.counters.get(FAILED, 0))


def replay_records(
    files: Sequence[str | os.PathLike[str]],
    chain: ExportChain,
    counts: SpanCounts,
    *,
    batch_size: int,
    on_progress: Callable[[int], None] | None = None,
) -> ReplaySummary:
    """Read the records of capture ``files`` (plain or gzip, in order) and hand them to ``chain`` in batches
    of ``batch_size``, as they were stored (``exporter: otlp`` rebuilds each LLM call's whole input on its way out).

    ``chain`` counts its outcomes in ``counts`` (``exported.<name>``, ``fallback``,
    ``failed``); an exception from it counts the batch as failed. Lines that are not
    records, or records that cannot be rebuilt, are bad lines; ``on_progress(n)`` gets
    the bytes read as reading goes.
    """
    summary = ReplaySummary()
    batch: list[ReadableSpan] = []

    def flush() -> None:
        if not batch:
            return
        try:
            chain.export(list(batch))
        except Exception:  # noqa: BLE001 - one bad batch must not end the replay
            counts.add(FAILED, len(batch))
        batch.clear()

    reading = CaptureRecords(files, rebuild=False, on_bytes=on_progress)
    for record in reading:
        try:
            span = record_to_span(record)
        except ValueError as exc:
            summary.bad_lines += 1
            if len(summary.bad) < MAX_LISTED:
                summary.bad.append((reading.summaries[-1].path, reading.last_line, str(exc)))
            continue
        summary.read += 1
        batch.append(span)
        if len(batch) >= batch_size:
            flush()
    flush()
    with contextlib.suppress(Exception):
        chain.flush(30.0)
    summary.bad_lines += reading.bad_lines
    summary.bad = sorted([*reading.bad_examples, *summary.bad])[:MAX_LISTED]
    summary.empty = reading.empty
    summary.counters = counts.snapshot()
    return summary


def replay_pipeline(config: BridgeConfig, target: str, counts: SpanCounts) -> Pipeline:
    """The bridge's export pipeline for ``target`` as ``config`` sets it up (``redact_attributes`` included),
    with spilling off: a replayed capture is already on disk. Replay calls its chain directly.

    Raises:
        ValueError: ``target`` cannot be built (e.g. ``otlp`` without its extra, an unwritable jsonl fallback).
    """
    # --to console writes the records as they were read (JSON), whatever console_format says.
    return Pipeline(dataclasses.replace(config, exporter=target, spill_max_bytes=0, console_format="json"), counts)


def start_ray_for(config: BridgeConfig, say: Callable[[str], None]) -> Any:
    """Start (or join, with ``RAY_ADDRESS``) Ray when RL-Insight is otherwise usable; the module, or None."""
    static = rl_insight_compat.probe_module(config.rl_insight_min_version)
    url = rl_insight_compat.server_url(config.rl_insight_server_url, config.rl_insight_config)
    if not static.usable or not url:
        return None
    ray = sys.modules.get("ray")
    if ray is None:
        if distribution_version("ray") is None:
            return None
        ray = importlib.import_module("ray")
    if ray.is_initialized():
        return None
    say("starting Ray: RL-Insight exports only from a process where Ray is initialized (--no-init-ray to skip)")
    ray.init(include_dashboard=False, log_to_driver=False)
    return ray
