"""Per-span cost of verl-otel-bridge next to bare OpenTelemetry and verl's direct RL-Insight calls.

One run measures every variant, interleaved round by round (the order rotates
each round) so machine noise hits them all alike, and writes:

* ``bench/results.json``: every figure, the machine and the versions;
* ``docs/performance.md``: the tables and ratios (between the ``bench:begin``
  and ``bench:end`` markers; text outside them is kept);
* ``docs/performance.png``: the per-span costs as a chart (needs matplotlib).

Variants (see ``docs/performance.md`` for what each one means):

===========  ==================================================================
``a``        bare OpenTelemetry SDK: own TracerProvider, BatchSpanProcessor,
             no-op exporter, the 4 span attributes + 9 identity keys by hand
``b1``       the bridge, ``exporter="none"`` (discard, exported inline)
``b2``       the bridge, ``exporter="jsonl"`` to /dev/null (through the export queue)
``b3``       the bridge's export queue + discard exporter (diagnostic: the exact
             structural twin of ``a``)
``b4``       the bridge's default config with no RL-Insight (auto -> bounded
             in-memory fallback, through the queue): what ``f`` runs
``c1``       the bridge disabled with ``enabled=False``
``c2``       the bridge disabled with ``OTEL_SDK_DISABLED=true``
``timer``    the timing loop with an empty body (what every figure includes)
``d``        verl's way: ``rl_insight.trace_span`` per span, real RL-Insight 0.3.0
``e``        the bridge forwarding to the same stack (``exporter="rl_insight"``,
             default transport), and ``e_hub`` (``rl_insight_transport="hub"``);
             for both also the export capacity (spans made first, then exported)
``f``        resident-set growth over 1,000,000 spans with the default bounded fallback
===========  ==================================================================

``d``/``e`` run in a subprocess with Ray on loopback and RL-Insight's discovery
server (from ``tests/integration/stack.py``), and an OTLP receiver in a process
of its own (as Tempo would be); ``f`` runs in its own subprocess. ``--smoke``
runs everything with tiny counts in a few seconds (``d``/``e`` only when
``rl_insight``, ``ray`` and ``opentelemetry-proto`` import) and writes to a
temporary directory unless ``--out-dir`` is given.

Usage::

    python bench/run.py                 # full run (about 3 minutes on 2 cores)
    python bench/run.py --smoke         # seconds; no thresholds
    python bench/run.py --out-dir DIR   # write results.json, performance.md/.png to DIR
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

import report  # noqa: E402  (bench/report.py)

pc = time.perf_counter_ns

# --------------------------------------------------------------------------- the workload

#: Span name and the 4 attributes every measured span carries (``bench_tag``
#: also tells the receiver which burst a span belongs to).
SPAN_NAME = "generate"
SPAN_ATTRIBUTES: dict[str, Any] = {"turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": "cost"}
#: ``bridge.session(...)`` arguments.
SESSION_ARGS: dict[str, Any] = {
    "sample": 7,
    "session": 3,
    "traj": 0,
    "uid": "u-1",
    "global_steps": 12,
    "session_id": "sess-1",
    "project": "bench",
    "experiment_name": "exp",
}
#: The same identity written by hand, as a caller without the bridge passes it.
IDENTITY: dict[str, Any] = {
    "project": "bench",
    "experiment_name": "exp",
    "sample": "7",
    "session": "3",
    "traj": "0",
    "state_lane_id": "experiment=exp/sample=7/session=3/traj=0",
    "uid": "u-1",
    "global_steps": 12,
    "session_id": "sess-1",
}
SESSION_SPAN_ATTRIBUTES: dict[str, Any] = {
    **IDENTITY,
    "monitor.trace_source": "session",
    "gen_ai.operation.name": "invoke_agent",
    "gen_ai.conversation.id": "sess-1",
}


@dataclass(frozen=True)
class Settings:
    """Counts for one run (full or smoke)."""

    micro_rounds: int
    micro_spans: int
    micro_warmup: int
    stack_rounds: int
    stack_spans: int
    stack_warmup: int
    rate_bursts: int
    rate_spans: int
    capacity_rounds: int
    capacity_spans: int
    delivery_timeout_s: float
    memory_spans: int
    memory_session_spans: int
    memory_sample_every: int


FULL = Settings(
    micro_rounds=100,
    micro_spans=500,
    micro_warmup=3000,
    stack_rounds=6,
    stack_spans=400,
    stack_warmup=300,
    rate_bursts=5,
    rate_spans=2000,
    capacity_rounds=3,
    capacity_spans=4096,
    delivery_timeout_s=30.0,
    memory_spans=1_000_000,
    memory_session_spans=1000,
    memory_sample_every=20_000,
)
SMOKE = Settings(
    micro_rounds=3,
    micro_spans=200,
    micro_warmup=100,
    stack_rounds=2,
    stack_spans=50,
    stack_warmup=50,
    rate_bursts=1,
    rate_spans=200,
    capacity_rounds=1,
    capacity_spans=512,
    delivery_timeout_s=20.0,
    memory_spans=5000,
    memory_session_spans=500,
    memory_sample_every=1000,
)


# --------------------------------------------------------------------------- statistics


def summarize(samples: array, round_medians: list[float]) -> dict[str, Any]:
    """Median, p99, mean (µs per span) of all samples, and the spread of per-round medians."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return {"n": 0}

    def quantile(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1000.0

    return {
        "n": n,
        "median_us": _median(ordered) / 1000.0,
        "p99_us": quantile(0.99),
        "p999_us": quantile(0.999),
        "mean_us": sum(ordered) / n / 1000.0,
        "min_us": ordered[0] / 1000.0,
        "round_median_us": {"min": min(round_medians), "max": max(round_medians)} if round_medians else None,
    }


def _median(ordered: Any) -> float:
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def median(values: Any) -> float:
    return _median(sorted(values))


# --------------------------------------------------------------------------- variants


@dataclass
class Variant:
    """One measured way of making a span.

    ``block(n, out, tag)`` makes ``n`` spans inside its own session (or parent
    span), appending each span's cost in ns to ``out``; only the span itself is
    inside the timed region. ``settle()`` runs untimed after each block (a flush),
    so leftover background work does not land on the next variant.
    """

    key: str
    label: str
    block: Callable[[int, array, str], None]
    settle: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    samples: array = field(default_factory=lambda: array("q"))
    round_medians: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def interleave(
    variants: list[Variant],
    rounds: int,
    spans: int,
    warmup: int,
    *,
    tag: str = "cost",
    after_block: Callable[[Variant, str, int], None] | None = None,
) -> None:
    """Warm every variant up, then run ``rounds`` rounds; round ``r`` starts at variant ``r % len``."""
    for variant in variants:
        scratch = array("q")
        variant.block(warmup, scratch, f"warm-{variant.key}")
        variant.settle()
        if after_block is not None:
            after_block(variant, f"warm-{variant.key}", warmup)
    k = len(variants)
    for r in range(rounds):
        for variant in variants[r % k :] + variants[: r % k]:
            block_tag = f"{tag}-{variant.key}-{r}"
            out = array("q")
            gc.collect()
            variant.block(spans, out, block_tag)
            variant.settle()
            if after_block is not None:
                after_block(variant, block_tag, spans)
            variant.samples.extend(out)
            variant.round_medians.append(median(out) / 1000.0)


def _timer_variant() -> Variant:
    def block(n: int, out: array, tag: str) -> None:
        append = out.append
        for _ in range(n):
            t0 = pc()
            append(pc() - t0)

    return Variant("timer", "timer overhead (empty timed body)", block)


def _otel_variant() -> Variant:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class NoopExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(NoopExporter()))
    tracer = provider.get_tracer("bench")
    identity = dict(IDENTITY)
    start_as_current_span = tracer.start_as_current_span

    def block(n: int, out: array, tag: str) -> None:
        append = out.append
        with start_as_current_span("agent_session", attributes=SESSION_SPAN_ATTRIBUTES):
            for _ in range(n):
                t0 = pc()
                with start_as_current_span(
                    SPAN_NAME,
                    attributes={**identity, "turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": tag},
                ):
                    pass
                append(pc() - t0)

    def attributes() -> dict[str, Any]:
        with (
            start_as_current_span("agent_session", attributes=SESSION_SPAN_ATTRIBUTES),
            start_as_current_span(SPAN_NAME, attributes={**identity, **SPAN_ATTRIBUTES}) as span,
        ):
            return dict(span.attributes)

    variant = Variant(
        "a",
        "bare OpenTelemetry SDK (BatchSpanProcessor + no-op exporter, identity by hand)",
        block,
        settle=lambda: provider.force_flush(),
        close=provider.shutdown,
    )
    variant.info["attributes"] = attributes()
    return variant


def _bridge_block(bridge: Any) -> Callable[[int, array, str], None]:
    span = bridge.span
    session = bridge.session

    def block(n: int, out: array, tag: str) -> None:
        append = out.append
        with session(**SESSION_ARGS):
            for _ in range(n):
                t0 = pc()
                with span(SPAN_NAME, turn=3, type="generate", prompt_tokens=512, bench_tag=tag):
                    pass
                append(pc() - t0)

    return block


def _bridge_attributes(bridge: Any) -> dict[str, Any]:
    with bridge.session(**SESSION_ARGS), bridge.span(SPAN_NAME, **SPAN_ATTRIBUTES) as span:
        return dict(span.attributes)


def _bridge_variant(key: str, label: str, bridge: Any) -> Variant:
    variant = Variant(key, label, _bridge_block(bridge), settle=bridge.force_flush, close=bridge.shutdown)
    variant.info["bridge"] = bridge
    return variant


def micro_variants(jsonl_path: str) -> list[Variant]:
    """Variants a, b1, b2, b3, c1, c2 and the timer, ready to run in this process."""
    from verl_otel_bridge import Bridge, BridgeConfig
    from verl_otel_bridge._internal.exporters.discard import Discard
    from verl_otel_bridge._internal.pipeline.chain import Named

    a = _otel_variant()
    b1 = _bridge_variant(
        "b1",
        "bridge, exporter=none (discard, exported inline)",
        Bridge(BridgeConfig.resolve(environ={}, exporter="none")),
    )
    b2 = _bridge_variant(
        "b2",
        "bridge, exporter=jsonl to /dev/null (export queue + worker thread)",
        Bridge(BridgeConfig.resolve(environ={}, exporter="jsonl", jsonl_path=jsonl_path)),
    )
    # b3: a jsonl bridge whose export processor hands batches to a discard exporter
    # instead: the bridge's queue and worker with an exporter that does nothing, which
    # is exactly what ``a`` has (BatchSpanProcessor + no-op exporter). Bench-only surgery.
    b3_bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="jsonl", jsonl_path=jsonl_path))
    chain = b3_bridge.pipeline.chain
    assert chain is not None
    chain.primary.destination.close()
    chain.primary = Named("none", Discard(), discards=True)
    b3 = _bridge_variant("b3", "bridge, export queue + discard exporter (diagnostic twin of a)", b3_bridge)
    # b4: the default config with no RL-Insight (hidden by the caller, see phase_micro):
    # exporter=auto -> RL-Insight exporter -> bounded in-memory fallback, through the queue.
    b4 = _bridge_variant(
        "b4",
        "bridge, default config, no RL-Insight (auto -> bounded memory fallback, queue)",
        Bridge(BridgeConfig.resolve(environ={})),
    )
    c1_bridge = Bridge(BridgeConfig.resolve(environ={}, enabled=False))
    c2_bridge = Bridge(BridgeConfig.resolve(environ={"OTEL_SDK_DISABLED": "true"}, exporter="none"))
    assert not c1_bridge.enabled and not c2_bridge.enabled, "disabled bridges are enabled"
    c1 = _bridge_variant("c1", "bridge disabled: enabled=False", c1_bridge)
    c2 = _bridge_variant("c2", "bridge disabled: OTEL_SDK_DISABLED=true", c2_bridge)
    for variant in (b1, b2, b3, b4):
        variant.info["attributes"] = _bridge_attributes(variant.info["bridge"])
    return [a, b1, b2, b3, b4, c1, c2, _timer_variant()]


def _variant_result(variant: Variant) -> dict[str, Any]:
    result = {"label": variant.label, **summarize(variant.samples, variant.round_medians)}
    result["round_medians_us"] = [round(x, 3) for x in variant.round_medians]
    bridge = variant.info.get("bridge")
    if bridge is not None:
        status = bridge.status()
        result["bridge_counters"] = status["counters"]
        result["bridge_exporter"] = status.get("exporter")
        if "rl_insight_transport" in status:
            result["rl_insight_transport"] = status["rl_insight_transport"]
    return result


def _paired(variants: list[Variant], base_key: str) -> dict[str, dict[str, float]]:
    """Per-round ratios of medians against the first variant (same round, so the same machine state)."""
    base = variants[0].round_medians
    paired = {}
    for variant in variants[1:]:
        per_round = [x / y for x, y in zip(variant.round_medians, base, strict=True)]
        paired[f"{variant.key}/{base_key}"] = {
            "median": median(per_round),
            "min": min(per_round),
            "max": max(per_round),
        }
    return paired


def phase_micro(settings: Settings) -> dict[str, Any]:
    """a, b1, b2, b3, c1, c2 and the timer, interleaved in this process."""
    started = time.monotonic()
    hidden = "rl_insight" not in sys.modules
    if hidden:  # b4 must see "RL-Insight not installed" whatever this interpreter has
        sys.modules["rl_insight"] = None  # type: ignore[assignment]
    variants = micro_variants("/dev/null")
    a_attrs = variants[0].info["attributes"]
    checks = {
        f"{v.key}_attributes_equal_a": v.info["attributes"] == a_attrs for v in variants if "attributes" in v.info
    }
    checks["a_attribute_count"] = len(a_attrs)
    interleave(variants, settings.micro_rounds, settings.micro_spans, settings.micro_warmup)
    results = {v.key: _variant_result(v) for v in variants}
    for variant in variants:
        variant.close()
    if hidden:
        del sys.modules["rl_insight"]
    return {
        "variants": results,
        "paired_round_ratios": _paired(variants, "a"),
        "checks": checks,
        "seconds": round(time.monotonic() - started, 1),
    }


# --------------------------------------------------------------------------- d and e: the RL-Insight stack


def _import_stack() -> Any:
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    sys.path.insert(0, str(REPO / "tests"))
    import stack

    return stack


def stack_unavailable() -> str | None:
    """Why d/e cannot run here, or None."""
    missing = []
    for module in ("rl_insight", "ray", "opentelemetry.proto"):
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120, check=False
        )
        if probe.returncode != 0:
            missing.append(module)
    if missing:
        return f"not importable in {sys.executable}: {', '.join(missing)} (install the bench extra)"
    if not (REPO / "tests" / "integration" / "stack.py").is_file():
        return "tests/integration/stack.py not found"
    return None


def _arrivals(receiver: Any, tag: str, expected: int, timeout_s: float) -> tuple[int, int | None]:
    """Wait (bounded) until ``expected`` spans tagged ``tag`` arrived: (received, arrival ns of the last).

    Arrival times are ``time.perf_counter_ns()`` in the receiver process: on Linux
    ``CLOCK_MONOTONIC``, one clock for the whole system, so they compare with this process's.
    """
    arrived = receiver.wait_arrivals(expected, timeout_s, attribute=("bench_tag", tag))
    return arrived.count, arrived.last_received_ns


def phase_stack(settings: Settings) -> dict[str, Any]:
    """d and e against Ray on loopback + RL-Insight's discovery server + an OTLP receiver."""
    stack = _import_stack()
    from otlp_receiver import OtlpReceiverProcess  # tests/otlp_receiver.py, on the path since _import_stack

    os.environ.update(stack.RAY_LOOPBACK_ENV)  # read by ray when first imported
    os.environ.update({"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    started = time.monotonic()
    timings: dict[str, float] = {}
    # In a process of its own, as Tempo is: served from this process, its HTTP handling and decoding
    # would compete with the exporters' threads for the GIL and the CPU, and understate delivery rates.
    receiver = OtlpReceiverProcess()
    server = stack.DiscoveryServer(otlp_port=receiver.port)
    bridges: dict[str, Any] = {}
    try:
        server.start()
        os.environ["RL_INSIGHT_SERVER_URL"] = server.url
        timings["discovery_server_s"] = round(time.monotonic() - started, 1)
        # The hub exports with an OpenTelemetry BatchSpanProcessor whose default delay is
        # 5 s; 200 ms (as the integration tests use) measures throughput, not that timer.
        hub_env = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
        with stack.ray_loopback(hub_env) as ray_info:
            timings["ray_s"] = round(time.monotonic() - started - timings["discovery_server_s"], 1)
            return _run_stack(settings, stack, receiver, server, ray_info, bridges, started, timings, hub_env)
    finally:
        for bridge in bridges.values():
            with contextlib.suppress(Exception):
                bridge.shutdown(timeout_s=5)
        server.close()
        receiver.stop()


def _run_stack(
    settings: Settings,
    stack: Any,
    receiver: Any,
    server: Any,
    ray_info: Any,
    bridges: dict[str, Any],
    started: float,
    timings: dict[str, float],
    hub_env: dict[str, str],
) -> dict[str, Any]:
    import ray
    import rl_insight
    import rl_insight.api

    from verl_otel_bridge import Bridge, BridgeConfig

    t = time.monotonic()
    rl_insight.init(project="bench", experiment_name="exp", config=ray_info.init_config())
    if not rl_insight.api._STATE.enabled:
        raise RuntimeError("rl_insight.init left monitoring disabled")
    stack.wait_until(
        lambda: stack.fetch_metrics(ray_info.metrics_port),
        60.0,
        interval_s=0.2,
        message="RL-Insight hub metrics endpoint never answered",
    )
    timings["rl_insight_init_s"] = round(time.monotonic() - t, 1)

    trace_span = rl_insight.trace_span
    identity = dict(IDENTITY)
    time_ns = time.time_ns

    def d_block(n: int, out: array, tag: str) -> None:
        append = out.append
        for _ in range(n):
            t0 = pc()
            start = time_ns()
            end = time_ns()
            trace_span(
                name=SPAN_NAME,
                start_time_ns=start,
                end_time_ns=end,
                attributes={**identity, "turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": tag},
            )
            append(pc() - t0)

    variants = [Variant("d", "verl direct: rl_insight.trace_span per span", d_block)]
    environ = {"VERL_RL_INSIGHT_ENABLE": "1", "RL_INSIGHT_SERVER_URL": server.url}
    # The bridge's own export delay is set to the hub's (see hub_env), so neither side's
    # timer dominates a burst's delivery time; everything else is the default config.
    base = {
        "environ": environ,
        "exporter": "rl_insight",
        "project": "bench",
        "experiment_name": "exp",
        "schedule_delay_ms": int(hub_env["OTEL_BSP_SCHEDULE_DELAY"]),
    }
    bridges["e"] = Bridge(BridgeConfig.resolve(**base))
    variants.append(_bridge_variant("e", "bridge -> RL-Insight, exporter=rl_insight, default transport", bridges["e"]))
    if "rl_insight_transport" in set(BridgeConfig.keys()):
        bridges["e_hub"] = Bridge(BridgeConfig.resolve(**base, rl_insight_transport="hub"))
        variants.append(
            _bridge_variant(
                "e_hub", "bridge -> RL-Insight, rl_insight_transport=hub (trace_span per span)", bridges["e_hub"]
            )
        )
    deliveries: dict[str, list[dict[str, Any]]] = {v.key: [] for v in variants}

    def after_block(variant: Variant, tag: str, spans: int) -> None:
        got, _ = _arrivals(receiver, tag, spans, settings.delivery_timeout_s)
        deliveries[variant.key].append({"tag": tag, "spans": spans, "received": got})

    # 1. Light load: short blocks (fewer spans than an export batch), each flushed and
    #    delivered before the next, so the bridge's export worker is idle while spans are made.
    t = time.monotonic()
    interleave(variants, settings.stack_rounds, settings.stack_spans, settings.stack_warmup, after_block=after_block)
    timings["light_rounds_s"] = round(time.monotonic() - t, 1)
    light = {v.key: _variant_result(v) for v in variants}
    light_paired = _paired(variants, "d")
    for variant in variants:
        variant.samples = array("q")
        variant.round_medians = []

    # 2. Sustained load: bursts of N spans, each span timed (the primary caller cost: the
    #    export worker runs while spans are made) and the burst's delivery rate: from the
    #    first span's start until the receiver holds all N (bounded wait). The variants
    #    alternate burst by burst.
    rates: dict[str, list[dict[str, Any]]] = {v.key: [] for v in variants}
    t = time.monotonic()
    k = len(variants)
    for burst in range(settings.rate_bursts):
        for variant in variants[burst % k :] + variants[: burst % k]:
            tag = f"rate-{variant.key}-{burst}"
            out = array("q")
            gc.collect()
            cpu0 = time.process_time_ns()
            t0 = pc()
            variant.block(settings.rate_spans, out, tag)
            produced = pc()
            got, last = _arrivals(receiver, tag, settings.rate_spans, settings.delivery_timeout_s)
            cpu = time.process_time_ns() - cpu0
            variant.settle()
            variant.samples.extend(out)
            variant.round_medians.append(median(out) / 1000.0)
            seconds = ((last if last is not None else pc()) - t0) / 1e9
            rates[variant.key].append(
                {
                    "spans": settings.rate_spans,
                    "received": got,
                    "lost": settings.rate_spans - got,
                    "caller_s": round((produced - t0) / 1e9, 4),
                    "delivered_s": round(seconds, 4),
                    "rate_per_s": round(got / seconds, 1) if seconds > 0 else None,
                    "process_cpu_us_per_span": round(cpu / 1000 / settings.rate_spans, 1),
                }
            )
    timings["rate_bursts_s"] = round(time.monotonic() - t, 1)

    # 3. Export capacity: what each transport delivers when nothing else runs in the
    #    process (see _export_capacity).
    t = time.monotonic()
    capacity = _export_capacity(settings, receiver, base, [v.key for v in variants if v.key in bridges])
    timings["capacity_s"] = round(time.monotonic() - t, 1)

    results = {v.key: _variant_result(v) for v in variants}
    for key, bursts in rates.items():
        results[key]["label"] += " [sustained bursts]"
        results[key]["delivery"] = {
            "bursts": bursts,
            "median_rate_per_s": median([b["rate_per_s"] or 0.0 for b in bursts]),
            "lost": sum(b["lost"] for b in bursts),
            "queue_bound": bridges[key].config.max_queue_size if key in bridges else None,
            "median_process_cpu_us_per_span": median([b["process_cpu_us_per_span"] for b in bursts]),
        }
        if key in capacity:
            results[key]["capacity"] = capacity[key]
        results[key]["light_load"] = {
            k2: light[key][k2] for k2 in ("n", "median_us", "p99_us", "mean_us", "round_median_us")
        }
        results[key]["light_load"]["delivered"] = {
            "spans": sum(x["spans"] for x in deliveries[key]),
            "received": sum(x["received"] for x in deliveries[key]),
        }
    paired = _paired(variants, "d")
    paired.update({f"{name} (light load)": value for name, value in light_paired.items()})
    rl_insight.finish()
    return {
        "variants": results,
        "paired_round_ratios": paired,
        "receiver": {"requests": receiver.request_count, "untagged_spans": receiver.count_without("bench_tag")},
        "hub_env": hub_env,
        "versions": {"ray": ray.__version__, "rl_insight": getattr(rl_insight, "__version__", None)},
        "timings_s": timings,
        "seconds": round(time.monotonic() - started, 1),
    }


def _export_capacity(
    settings: Settings, receiver: Any, base: dict[str, Any], keys: list[str]
) -> dict[str, dict[str, Any]]:
    """Spans per second each bridge variant's exporter delivers when nothing else competes.

    The spans are made first, by an in-memory bridge (the same attributes as the bursts),
    then handed to a fresh ``RLInsightSpanExporter`` configured like the variant, in
    batches of ``max_export_batch_size``, on this thread: the rate runs from the first
    export call until the receiver holds every span. This is the transport's ceiling;
    the bursts above measure it while the caller makes spans on the same cores.
    """
    from verl_otel_bridge import Bridge, BridgeConfig
    from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter

    transports = {"e": {}, "e_hub": {"rl_insight_transport": "hub"}}
    exporters = {key: RLInsightSpanExporter(config=BridgeConfig.resolve(**base, **transports[key])) for key in keys}
    batch = BridgeConfig.resolve(**base).max_export_batch_size
    made = Bridge(BridgeConfig.resolve(environ={}, exporter="memory", memory_max_spans=settings.capacity_spans + 1))

    def spans(tag: str) -> list[Any]:
        assert made.memory_exporter is not None
        made.memory_exporter.clear()
        with made.session(**SESSION_ARGS):
            for _ in range(settings.capacity_spans):
                with made.span(SPAN_NAME, turn=3, type="generate", prompt_tokens=512, bench_tag=tag):
                    pass
        return [s for s in made.memory_exporter.get_finished_spans() if s.attributes.get("bench_tag") == tag]

    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
    try:
        for key, exporter in exporters.items():  # discovery, rl_insight.init: before timing
            warm = spans(f"capacity-warm-{key}")[:1]
            exporter.export(warm)
            _arrivals(receiver, f"capacity-warm-{key}", 1, settings.delivery_timeout_s)
        for number in range(settings.capacity_rounds):
            for key in keys[number % len(keys) :] + keys[: number % len(keys)]:
                tag = f"capacity-{key}-{number}"
                ready = spans(tag)
                gc.collect()
                t0 = pc()
                for i in range(0, len(ready), batch):
                    exporters[key].export(ready[i : i + batch])
                got, last = _arrivals(receiver, tag, len(ready), settings.delivery_timeout_s)
                seconds = ((last if last is not None else pc()) - t0) / 1e9
                rate = round(got / seconds, 1)
                rounds[key].append({"spans": len(ready), "received": got, "lost": len(ready) - got, "rate_per_s": rate})
    finally:
        for exporter in exporters.values():
            exporter.shutdown()
        made.shutdown()
    return {
        key: {
            "rounds": rs,
            "median_rate_per_s": median([r["rate_per_s"] for r in rs]),
            "lost": sum(r["lost"] for r in rs),
        }
        for key, rs in rounds.items()
    }


# --------------------------------------------------------------------------- f: memory


def _rss_kb() -> tuple[int, int]:
    rss = hwm = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def phase_memory(settings: Settings) -> dict[str, Any]:
    """RSS while ``memory_spans`` spans go through a default bridge with no RL-Insight.

    ``exporter=auto`` with RL-Insight not importable (hidden here, so the result does
    not depend on what is installed) routes spans to the bounded in-memory fallback.
    """
    sys.modules["rl_insight"] = None  # type: ignore[assignment]  # "not installed"
    from verl_otel_bridge import Bridge, BridgeConfig

    started = time.monotonic()
    bridge = Bridge(BridgeConfig.resolve(environ={}))
    span, session = bridge.span, bridge.session
    gc.collect()
    rss0, _ = _rss_kb()
    samples = [(0, rss0, 0)]
    counts = bridge.counts
    made = 0
    t0 = pc()
    while made < settings.memory_spans:
        with session(**SESSION_ARGS):
            for _ in range(min(settings.memory_session_spans, settings.memory_spans - made)):
                with span(SPAN_NAME, turn=3, type="generate", prompt_tokens=512, bench_tag="memory"):
                    pass
                made += 1
                if made % settings.memory_sample_every == 0:
                    samples.append((made, _rss_kb()[0], counts.get("dropped")))
    elapsed = (pc() - t0) / 1e9
    bridge.force_flush(30)
    rss_end, hwm = _rss_kb()
    status = bridge.status()
    kept = len(bridge.memory_exporter.get_finished_spans()) if bridge.memory_exporter is not None else None
    bridge.shutdown()
    tenth = next((kb for n, kb, _ in samples if n >= settings.memory_spans // 10), rss0)
    return {
        "spans": made,
        "route": status.get("exporter"),
        "reason": status.get("reason"),
        "memory_max_spans": bridge.config.memory_max_spans,
        "kept_spans": kept,
        "counters": status["counters"],
        "rss_start_mb": rss0 / 1024,
        "rss_end_mb": rss_end / 1024,
        "rss_peak_mb": hwm / 1024,
        "growth_mb": (rss_end - rss0) / 1024,
        "peak_growth_mb": (max([kb for _, kb, _ in samples] + [rss_end]) - rss0) / 1024,
        "growth_after_first_tenth_mb": (rss_end - tenth) / 1024,
        "samples": [(n, round(kb / 1024, 1), dropped) for n, kb, dropped in samples],
        "seconds": round(time.monotonic() - started, 1),
        "us_per_span": elapsed / max(made, 1) * 1e6,
    }


# --------------------------------------------------------------------------- orchestration


def machine() -> dict[str, Any]:
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": report.cpu_model(),
        "mem_total_gb": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "load_average_start": list(os.getloadavg()),
    }


def versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in (
        "verl-otel-bridge",
        "opentelemetry-sdk",
        "opentelemetry-api",
        "rl-insight",
        "ray",
        "opentelemetry-proto",
        "matplotlib",
    ):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def run_phase_subprocess(phase: str, args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """Run ``phase`` in a fresh interpreter (so Ray or a million spans leave this one alone)."""
    with tempfile.TemporaryDirectory(prefix="vob-bench-") as tmp:
        out = Path(tmp) / f"{phase}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, "--phase-out", str(out)]
        return _run_for_json([*cmd, *(["--smoke"] if args.smoke else [])], out, timeout_s, f"phase {phase}")


def run_noloss(smoke: bool) -> dict[str, Any]:
    """``bench/noloss.py`` (bursts, spill, sampling) in a fresh interpreter; its results, or the error."""
    return run_script("noloss.py", smoke, timeout_s=300 if smoke else 1200)


def run_export_cpu(smoke: bool) -> dict[str, Any]:
    """``bench/export_cpu.py`` (whole-process CPU per span, per exporter) in a fresh interpreter."""
    return run_script("export_cpu.py", smoke, timeout_s=300 if smoke else 1200)


def run_slow_destination(smoke: bool) -> dict[str, Any]:
    """``bench/slow_destination.py`` (the caller behind a healthy vs a slow OTLP endpoint) in a fresh interpreter."""
    return run_script("slow_destination.py", smoke, timeout_s=300)


def run_script(name: str, smoke: bool, timeout_s: float) -> dict[str, Any]:
    """``bench/<name> --json OUT [--smoke]`` in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="vob-bench-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve().with_name(name)), "--json", str(out)]
        return _run_for_json([*cmd, *(["--smoke"] if smoke else [])], out, timeout_s, f"bench/{name}")


def _run_for_json(cmd: list[str], out: Path, timeout_s: float, what: str) -> dict[str, Any]:
    """Run ``cmd`` (bounded) with no bridge, OpenTelemetry or RL-Insight setting in its environment; the JSON
    it wrote to ``out``, or the error and the tail of its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_OTEL_BRIDGE_"))}
    env.pop("RL_INSIGHT_SERVER_URL", None)
    env.pop("VERL_RL_INSIGHT_ENABLE", None)
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return {"error": f"{what} timed out after {timeout_s:.0f} s", "stderr": _tail(exc.stderr)}
    if proc.returncode != 0 or not out.is_file():
        return {"error": f"{what} exited {proc.returncode}", "stderr": _tail(proc.stderr)}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _tail(text: Any, lines: int = 25) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny counts, a few seconds, no thresholds")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="write results.json, performance.md and performance.png here "
        "(default: bench/ and docs/ of the repository; a temporary directory with --smoke)",
    )
    parser.add_argument("--skip-stack", action="store_true", help="leave out d and e")
    parser.add_argument("--skip-memory", action="store_true", help="leave out f")
    parser.add_argument("--phase", choices=("micro", "stack", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--phase-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings = SMOKE if args.smoke else FULL

    if args.phase:
        result = {"micro": phase_micro, "stack": phase_stack, "memory": phase_memory}[args.phase](settings)
        args.phase_out.write_text(json.dumps(result, default=str))
        return 0

    began = time.monotonic()
    command = "python bench/run.py" + "".join(
        f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:])
    )
    results: dict[str, Any] = {
        "meta": {
            "command": command,
            "smoke": args.smoke,
            "settings": settings.__dict__,
            "machine": machine(),
            "versions": versions(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "variants": {},
        "skipped": {},
    }
    stray = sorted(k for k in os.environ if k.startswith(("OTEL_", "VERL_OTEL_BRIDGE_")))
    if stray:
        print(f"note: {', '.join(stray)} set in the environment; variant a/b read none of them", file=sys.stderr)

    print(
        f"micro (a, b1-b4, c1, c2): {settings.micro_rounds} rounds x {settings.micro_spans} spans ...",
        file=sys.stderr,
        flush=True,
    )
    micro = phase_micro(settings)
    results["variants"].update(micro["variants"])
    results["paired_round_ratios"] = dict(micro["paired_round_ratios"])
    results["checks"] = micro["checks"]
    results["meta"]["micro_seconds"] = micro["seconds"]

    if args.skip_stack:
        results["skipped"]["d"] = results["skipped"]["e"] = "--skip-stack"
    else:
        reason = stack_unavailable()
        if reason is not None:
            results["skipped"]["d"] = results["skipped"]["e"] = reason
        else:
            print("stack (d, e): Ray + RL-Insight on loopback ...", file=sys.stderr, flush=True)
            stack = run_phase_subprocess("stack", args, timeout_s=240 if args.smoke else 420)
            if "error" in stack:
                results["skipped"]["d"] = results["skipped"]["e"] = stack["error"]
                results["meta"]["stack_stderr"] = stack.get("stderr")
                print(f"stack phase failed: {stack['error']}\n{stack.get('stderr')}", file=sys.stderr)
            else:
                results["variants"].update(stack["variants"])
                results["paired_round_ratios"].update(stack["paired_round_ratios"])
                results["stack"] = {k: v for k, v in stack.items() if k not in ("variants", "paired_round_ratios")}
                results["meta"]["versions"].update({k.replace("_", "-"): v for k, v in stack["versions"].items()})

    if args.skip_memory:
        results["skipped"]["f"] = "--skip-memory"
    else:
        print(f"memory (f): {settings.memory_spans:,} spans in a subprocess ...", file=sys.stderr, flush=True)
        memory = run_phase_subprocess("memory", args, timeout_s=120 if args.smoke else 300)
        if "error" in memory:
            results["skipped"]["f"] = memory["error"]
            print(f"memory phase failed: {memory['error']}\n{memory.get('stderr')}", file=sys.stderr)
        else:
            results["memory"] = memory

    print("bursts, spill and sampling (bench/noloss.py) in a subprocess ...", file=sys.stderr, flush=True)
    results["noloss"] = run_noloss(args.smoke)
    print(
        "whole-process CPU per span by exporter (bench/export_cpu.py) in a subprocess ...", file=sys.stderr, flush=True
    )
    results["export_cpu"] = run_export_cpu(args.smoke)
    print("the caller behind a slow destination (bench/slow_destination.py) in a subprocess ...", file=sys.stderr)
    results["slow_destination"] = run_slow_destination(args.smoke)

    results["meta"]["machine"]["load_average_end"] = list(os.getloadavg())
    results["meta"]["seconds"] = round(time.monotonic() - began, 1)
    results["ratios"] = report.ratios(results)
    results["targets"] = report.targets(results)

    if args.out_dir is not None:
        out_dir = args.out_dir
        paths = {"json": out_dir / "results.json", "md": out_dir / "performance.md", "png": out_dir / "performance.png"}
    elif args.smoke:
        out_dir = Path(tempfile.mkdtemp(prefix="vob-bench-smoke-"))
        paths = {"json": out_dir / "results.json", "md": out_dir / "performance.md", "png": out_dir / "performance.png"}
    else:
        paths = {
            "json": BENCH_DIR / "results.json",
            "md": REPO / "docs" / "performance.md",
            "png": REPO / "docs" / "performance.png",
        }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    results["meta"]["chart"] = report.chart(results, paths["png"])
    paths["json"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    report.write_markdown(results, paths["md"], chart_name=paths["png"].name)
    print(report.summary_table(results))
    print(
        f"\nwrote {paths['json']}, {paths['md']}"
        + (f", {paths['png']}" if results["meta"]["chart"] == "written" else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
