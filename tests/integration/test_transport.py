"""The RL-Insight exporter's transports (``hub``, ``otlp``, ``auto``) against the real RL-Insight 0.3.0.

Both transports end at the session's OTLP receiver (the stand-in for Tempo): ``hub``
through RL-Insight's own ``trace_span`` -> monitor hub actor -> OTLP path, ``otlp`` by
the bridge posting batches to the endpoint RL-Insight's discovery server advertises.
The tests compare what arrives, switch between them, break the endpoint mid-run and
measure the throughput of each.

A bridge here is built on a ``TracerProvider`` of the test's own, with a sequential
span-id generator and a per-run trace-id prefix: two runs of the same agent loop get
the same span ids, so their spans can be paired by ``(name, otel.span_id)``, and the
trace-id prefix tells the runs apart at the shared receiver. An extra in-memory
processor on that provider records what the bridge was handed (the ground truth).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from otlp_receiver import OtlpReceiver, ReceivedSpan
from stack import DiscoveryServer, RlInsightHub, wait_until
from threads import burst

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

pytestmark = pytest.mark.rl_insight("0.3.0")

#: What RL-Insight's hub adds to every span of this process (``rl_insight_hub`` inits with p/e).
HUB_LABELS = {"project": "p", "experiment_name": "e"}
#: Resource attributes that may legitimately differ between the hub's provider and the bridge's.
PER_PROCESS_RESOURCE_KEYS = frozenset({"service.instance.id", "process.pid", "host.name"})
#: Bound of every wait for spans at a receiver.
DELIVERY_TIMEOUT_S = 60.0


class SequentialIds(IdGenerator):
    """Span ids 1, 2, 3, ... (offset so they look random enough); trace ids ``<prefix><counter>``."""

    def __init__(self, trace_prefix: int) -> None:
        self.trace_prefix = trace_prefix
        self._spans = itertools.count(1)
        self._traces = itertools.count(1)

    def generate_span_id(self) -> int:
        return (0x5EED << 48) | next(self._spans)

    def generate_trace_id(self) -> int:
        return (self.trace_prefix << 64) | next(self._traces)


@dataclass
class Run:
    """One bridge run: the bridge, what it was handed, and how to find its spans at a receiver."""

    bridge: Bridge
    provider: TracerProvider
    handed: InMemorySpanExporter
    trace_prefix: str

    def mine(self, span: ReceivedSpan) -> bool:
        """Whether ``span`` (as received) came from this run."""
        return str(span.attributes.get("otel.trace_id", "")).startswith(self.trace_prefix)

    def sent(self) -> list[ReadableSpan]:
        return list(self.handed.get_finished_spans())


@contextmanager
def bridge_run(server_url: str, transport: str, **settings: Any) -> Iterator[Run]:
    """A bridge forwarding to RL-Insight over ``transport``, shut down (bounded) on exit."""
    prefix = secrets.randbits(63) | 1
    provider = TracerProvider(id_generator=SequentialIds(prefix), shutdown_on_exit=False)
    handed = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(handed))
    config = BridgeConfig.resolve(
        environ={},
        exporter="rl_insight",
        rl_insight_transport=transport,
        rl_insight_server_url=server_url,
        **{"schedule_delay_ms": 20, "shutdown_timeout_s": 20.0, **HUB_LABELS, **settings},
    )
    bridge = Bridge(config, provider=provider)
    try:
        yield Run(bridge, provider, handed, f"{prefix:016x}")
    finally:
        bridge.shutdown()
        provider.shutdown()


def agent_loop(bridge: Bridge, sample: str, sessions: int = 2, turns: int = 3) -> None:
    """A simulated agent loop: sessions with a task, generate and tool turns, a failing
    tool turn, a span recorded with explicit times, and plain spans with converted values."""
    for number in range(sessions):
        with bridge.session(
            sample=sample, session=f"s{number}", traj=number, uid="uid-7", global_steps=3, session_id=f"conv-{number}"
        ) as session:
            with session.task("solve", difficulty="hard") as task:
                for turn in range(turns):
                    with session.turn(turn, type="generate") as handle:
                        handle.record(
                            finish_reason="tool_calls",
                            prompt_tokens=100 + turn,
                            completion_tokens=20 + turn,
                            content=f"thinking about step {turn}",
                            reasoning="because",
                        )
                    with session.turn(turn, type="tool") as handle:
                        handle.record(tools=["search", "calc"], tool_args={"q": turn, "deep": [1, 2]})
                        started = time.time_ns()
                        bridge.record_span(
                            "sandbox.exec",
                            start_time_ns=started - 2_000_000,
                            end_time_ns=started,
                            attributes={"exit_code": 0, "argv": ["python", "-c", "1"]},
                        )
                try:
                    with session.turn(turns, type="tool"):
                        raise ValueError("tool crashed")
                except ValueError:
                    pass
                task.set_result(status="success", reward=1.0, accuracy=0.5, finished=True, reward_posted=False)
            with bridge.span("rollout.postprocess", meta={"k": "v"}, scores=[0.25, 0.5], ok=True):
                pass
            session.finish(
                status="success",
                trajectories=[{"chain_id": number, "reward_score": 0.5, "num_turns": turns}],
                runner_name="runner",
                reward_source="rm",
                finished=True,
            )


def plain(value: Any) -> Any:
    """Attribute values as decoded from OTLP (tuples become lists)."""
    return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def by_span_id(spans: Sequence[ReceivedSpan]) -> dict[tuple[str, str], ReceivedSpan]:
    """Received spans keyed by ``(name, otel.span_id)``; fails on a duplicate."""
    keyed: dict[tuple[str, str], ReceivedSpan] = {}
    for span in spans:
        key = (span.name, str(span.attributes.get("otel.span_id")))
        assert key not in keyed, f"span {key} received twice"
        keyed[key] = span
    return keyed


def hex_ids(span: ReadableSpan) -> tuple[str, str, str]:
    """``(trace id, span id, parent span id or "")`` as the forwarded ``otel.*`` attributes spell them."""
    context = span.get_span_context()
    parent = format(span.parent.span_id, "016x") if span.parent is not None else ""
    return format(context.trace_id, "032x"), format(context.span_id, "016x"), parent


def check_against_sent(run: Run, received: dict[tuple[str, str], ReceivedSpan]) -> None:
    """Each span the bridge was handed arrived once, with its times, attributes, ids and the hub's labels."""
    sent = run.sent()
    assert len(received) == len(sent), (len(received), len(sent))
    labels = {"process_id": str(os.getpid()), **HUB_LABELS}
    for span in sent:
        trace_id, span_id, parent_id = hex_ids(span)
        got = received[(span.name, span_id)]
        assert (got.start_time_ns, got.end_time_ns) == (span.start_time, span.end_time), span.name
        attributes = dict(got.attributes)
        assert attributes.pop("otel.trace_id") == trace_id
        assert attributes.pop("otel.span_id") == span_id
        assert attributes.pop("otel.parent_span_id") == parent_id
        assert attributes.pop("otel.status_code") == span.status.status_code.name
        if span.status.description:
            assert attributes.pop("otel.status_description") == span.status.description
        exceptions = [e for e in span.events if e.name == "exception"]
        if exceptions:
            assert attributes.pop("exception.type") == exceptions[0].attributes["exception.type"]
            assert attributes.pop("exception.message") == exceptions[0].attributes["exception.message"]
        expected = {**labels, **{key: plain(value) for key, value in (span.attributes or {}).items()}}
        assert attributes == expected, span.name


def wait_for_run(
    receiver: OtlpReceiver, run: Run, count: int, timeout_s: float = DELIVERY_TIMEOUT_S
) -> list[ReceivedSpan]:
    """Wait (bounded) until ``count`` spans of ``run`` arrived; return exactly those."""
    return receiver.wait_for(count, timeout_s=timeout_s, where=run.mine)


def assert_hierarchy(spans: Sequence[ReceivedSpan], *, real_links: bool) -> None:
    """Every ``otel.parent_span_id`` names a span of the set; with ``real_links`` the OTLP
    parent/trace ids equal the ``otel.*`` attributes, otherwise every span is a root."""
    ids = {s.attributes["otel.span_id"] for s in spans}
    for span in spans:
        parent = span.attributes["otel.parent_span_id"]
        assert parent == "" or parent in ids, f"{span.name}: parent {parent} not delivered"
        if real_links:
            assert span.trace_id == span.attributes["otel.trace_id"]
            assert span.span_id == span.attributes["otel.span_id"]
            assert span.parent_span_id == (parent or None)
        else:
            assert span.parent_span_id is None, f"hub span {span.name} has a parent link"


# ------------------------------------------------------------------- parity


def test_hub_and_otlp_deliver_the_same_spans_and_attributes(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    receiver, url = rl_insight_hub.receiver, rl_insight_hub.server.url
    sample = f"parity-{run_tag}"
    delivered: dict[str, dict[tuple[str, str], ReceivedSpan]] = {}
    runs: dict[str, Run] = {}
    for transport in ("hub", "otlp"):
        with bridge_run(url, transport) as run:
            agent_loop(run.bridge, sample)
            assert run.bridge.force_flush(30)
            status = run.bridge.status()
            counters = status["counters"]
            assert status["rl_insight_transport"] == transport, status
            assert status["reason"] == "ok", status
            expected_name = "rl_insight" if transport == "hub" else "rl_insight_otlp"
            assert counters["exported"] == {expected_name: counters["ended"]}, counters
            assert balance(counters) == 0 and counters["fallback"] == counters["dropped"] == 0, counters
            assert counters["session_gauges_published"] == 2, counters
            runs[transport] = run
            delivered[transport] = by_span_id(wait_for_run(receiver, run, len(run.sent())))
            check_against_sent(run, delivered[transport])

    hub, otlp = delivered["hub"], delivered["otlp"]
    assert set(hub) == set(otlp)  # the same (name, otel.span_id) pairs
    names = Counter(name for name, _ in hub)
    assert names == Counter(
        {"agent_turn": 14, "sandbox.exec": 6, "agent_task": 2, "rollout.postprocess": 2, "agent_session": 2}
    )
    for key in hub:
        h, o = hub[key], otlp[key]
        # Only the run's trace-id prefix differs between the two runs' attributes.
        assert {**h.attributes, "otel.trace_id": ""} == {**o.attributes, "otel.trace_id": ""}, key
        assert h.attributes["process_id"] == o.attributes["process_id"] == str(os.getpid())
        for label, value in HUB_LABELS.items():
            assert h.attributes[label] == o.attributes[label] == value, (key, label)
        assert h.resource["service.name"] == o.resource["service.name"] == "rl_insight_monitor"
        assert {k: v for k, v in h.resource.items() if k not in PER_PROCESS_RESOURCE_KEYS} == {
            k: v for k, v in o.resource.items() if k not in PER_PROCESS_RESOURCE_KEYS
        }
        # The hub flattens spans into roots and keeps no status; otlp keeps both.
        assert h.parent_span_id is None and h.status_code == 0
        assert o.status_code == {"UNSET": 0, "OK": 1, "ERROR": 2}[o.attributes["otel.status_code"]]

    assert_hierarchy(list(hub.values()), real_links=False)
    assert_hierarchy(list(otlp.values()), real_links=True)

    for key, span in otlp.items():
        attributes = span.attributes
        if key[0] in ("agent_session", "agent_task", "agent_turn", "sandbox.exec", "rollout.postprocess"):
            for identity_key in IDENTITY_KEYS:
                assert identity_key in attributes, (key, identity_key)
            assert attributes["sample"] == sample
            assert attributes["project"] == "p" and attributes["experiment_name"] == "e"
            assert attributes["state_lane_id"] == (
                f"experiment=e/sample={sample}/session={attributes['session']}/traj={attributes['traj']}"
            )
            assert type(attributes["global_steps"]) is int and attributes["global_steps"] == 3
        if key[0] == "agent_turn":
            assert type(attributes["turn"]) is int
    failed = [s for s in otlp.values() if s.attributes["otel.status_code"] == "ERROR"]
    assert {s.name for s in failed} == {"agent_turn"} and len(failed) == 2
    assert all(s.attributes["exception.type"] == "ValueError" for s in failed)
    assert all(s.attributes["exception.message"] == "tool crashed" for s in failed)


def test_otlp_adds_the_labels_the_hub_would_even_when_rl_insight_was_initialised_elsewhere(
    rl_insight_hub: RlInsightHub, run_tag: str
) -> None:
    # rl_insight.init ran once for this process (project="p", experiment_name="e", by the
    # session fixture); a bridge configured differently does not call it again, and the
    # hub keeps adding init's labels. The direct path must add the same ones.
    received = {}
    for transport in ("hub", "otlp"):
        with bridge_run(rl_insight_hub.server.url, transport, project="other", experiment_name=None) as run:
            with run.bridge.span("labels.outside_session", tag=run_tag):
                pass
            assert run.bridge.force_flush(30)
        (span,) = wait_for_run(rl_insight_hub.receiver, run, 1)
        received[transport] = span.attributes
    assert received["hub"]["project"] == "p" and received["hub"]["experiment_name"] == "e"
    assert {k: v for k, v in received["otlp"].items() if not k.startswith("otel.")} == {
        k: v for k, v in received["hub"].items() if not k.startswith("otel.")
    }


# ----------------------------------------------------------------------- auto


def test_auto_uses_otlp_when_the_server_advertises_a_port(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    with bridge_run(rl_insight_hub.server.url, "auto") as run:
        agent_loop(run.bridge, f"auto-otlp-{run_tag}", sessions=1, turns=1)
        assert run.bridge.force_flush(30)
        status = run.bridge.status()
    assert status["rl_insight_transport"] == "otlp", status
    assert status["exporters"]["rl_insight"]["endpoint"] == rl_insight_hub.receiver.url
    assert status["exporters"]["rl_insight"]["last_error"] is None, status
    counters = status["counters"]
    assert counters["exported"] == {"rl_insight_otlp": counters["ended"]} and balance(counters) == 0, counters
    spans = wait_for_run(rl_insight_hub.receiver, run, counters["ended"])
    check_against_sent(run, by_span_id(spans))
    assert_hierarchy(spans, real_links=True)
    assert any(s.parent_span_id for s in spans)  # real OTLP parent links: it took the direct path


def test_auto_uses_the_hub_when_the_server_advertises_no_port(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    # The bridge asks this server (no otlp_port); the hub, created at session start,
    # keeps exporting to the session's receiver, so hub-routed spans still arrive there.
    with DiscoveryServer(otlp_port=None) as no_traces, bridge_run(no_traces.url, "auto") as run:
        agent_loop(run.bridge, f"auto-hub-{run_tag}", sessions=1, turns=1)
        assert run.bridge.force_flush(30)
        status = run.bridge.status()
    assert status["rl_insight_transport"] == "hub", status
    assert status["exporters"]["rl_insight"]["endpoint"] is None
    assert "advertises no otlp_port" in (status["exporters"]["rl_insight"]["last_error"] or ""), status
    counters = status["counters"]
    assert counters["exported"] == {"rl_insight": counters["ended"]} and balance(counters) == 0, counters
    spans = wait_for_run(rl_insight_hub.receiver, run, counters["ended"])
    check_against_sent(run, by_span_id(spans))
    assert_hierarchy(spans, real_links=False)  # roots only: it went through trace_span


# ------------------------------------------------------------ endpoint failure


def _emit_until(run: Run, phase: str, done: Callable[[], bool], timeout_s: float, per_round: int = 10) -> int:
    """Emit rounds of spans (tagged ``phase``), flushing after each, until ``done()``; bounded."""
    emitted = 0

    def round_done() -> bool:
        nonlocal emitted
        for _ in range(per_round):
            with run.bridge.span(f"fault.{phase}", phase=phase, i=emitted):
                emitted += 1
        run.bridge.force_flush(30)
        return done()

    wait_until(round_done, timeout_s, interval_s=0.05, message=f"phase {phase}: condition not reached")
    return emitted


@pytest.mark.parametrize("outage", ["503", "stopped"])
def test_endpoint_failure_mid_run_loses_nothing_and_duplicates_nothing(
    rl_insight_hub: RlInsightHub, outage: str
) -> None:
    # The bridge's direct path gets a receiver (and discovery server) of its own, so
    # the outage hits only that path; the hub keeps exporting to the session receiver.
    direct = OtlpReceiver()
    receivers: list[OtlpReceiver] = [direct]
    try:
        with (
            DiscoveryServer(otlp_port=direct.port) as server,
            bridge_run(server.url, "otlp", max_export_batch_size=20) as run,
        ):
            bridge = run.bridge
            _emit_until(run, "before", lambda: bridge.status()["rl_insight_transport"] == "otlp", 30)
            # Outage: answer 503, or the backend gone (connections cut, then refused).
            if outage == "503":
                direct.status = 503
            else:
                direct.stop()
            _emit_until(
                run,
                "during",
                lambda: bridge.status()["counters"]["exported"].get("rl_insight", 0) >= 30,
                60,
            )
            during = bridge.status()
            assert during["rl_insight_transport"] == "hub", during
            assert during["exporters"]["rl_insight"]["last_error"], during
            assert during["counters"]["otlp_failed_batches"] >= 1, during
            # Recovery: the endpoint is retried with backoff and the direct path resumes.
            if outage == "503":
                direct.status = 200
            else:
                direct = OtlpReceiver(port=direct.port)
                receivers.append(direct)
            _emit_until(run, "after", lambda: bridge.status()["rl_insight_transport"] == "otlp", 60)
            with bridge.span("fault.last", phase="after", i=-1):
                pass
            assert bridge.force_flush(30)
            status = bridge.status()
            sent = run.sent()

        counters = status["counters"]
        assert balance(counters) == 0, counters
        assert counters["fallback"] == counters["dropped"] == counters["failed"] == 0, counters
        assert counters["ended"] == len(sent)
        assert status["rl_insight_transport"] == "otlp", status
        assert status["exporters"]["rl_insight"]["last_error"] is None, status  # recovered: no stale error reported

        exported = counters["exported"]
        assert exported["rl_insight"] >= 30 and exported["rl_insight_otlp"] >= 1, exported
        via_hub = wait_for_run(rl_insight_hub.receiver, run, exported["rl_insight"])
        via_otlp = wait_until(
            lambda: (
                spans
                if len(spans := [s for r in receivers for s in r.spans if run.mine(s)]) >= exported["rl_insight_otlp"]
                else None
            ),
            DELIVERY_TIMEOUT_S,
            message="direct-path spans did not all arrive",
        )
        # Exactly once: nothing missing, nothing twice, across both paths.
        everything = Counter((s.name, s.attributes["otel.span_id"]) for s in [*via_hub, *via_otlp])
        assert max(everything.values()) == 1, [k for k, n in everything.items() if n > 1][:5]
        assert set(everything) == {(s.name, hex_ids(s)[1]) for s in sent}
        assert len(via_hub) == exported["rl_insight"] and len(via_otlp) == exported["rl_insight_otlp"]
        assert {s.attributes["phase"] for s in via_hub} >= {"during"}
        assert "before" in {s.attributes["phase"] for s in via_otlp}
        assert_hierarchy(via_hub, real_links=False)
        assert_hierarchy(via_otlp, real_links=True)
    finally:
        for receiver in receivers:
            receiver.stop()


# ------------------------------------------------------------------ throughput

#: Spans per transport in the throughput test.
THROUGHPUT_SPANS = 3000
#: Asserted ratio otlp/hub. This is a timed test on a shared 2-core machine, so it
#: only catches a direct path that is not clearly faster than the hub (e.g. silently
#: going through it). The benchmark (``make bench``) owns the headline figures:
#: there otlp's export capacity is about 23x the hub's, and 8.5-10x while a caller
#: makes spans flat out on the same two cores; here, with this test's extra
#: in-memory copy of every span and sessions' gauges in the process, about 6-9x.
MIN_SPEEDUP = 3.0
#: Each transport is measured this many times, alternating; each keeps its best rate.
THROUGHPUT_ROUNDS = 2


@dataclass
class Throughput:
    spans: list[ReceivedSpan]  # the timed spans, as received
    produced_s: float  # first span end -> last span end (the caller's loop)
    delivered_s: float  # first span end -> the last of them read by the receiver

    @property
    def rate(self) -> float:
        return len(self.spans) / self.delivered_s


def _throughput(hub: RlInsightHub, transport: str, sample: str) -> Throughput:
    """Make THROUGHPUT_SPANS agent-loop spans as fast as the caller can and time their delivery.

    Delivered means read by the receiver (its arrival stamp on the request that
    carried the span), whatever the bridge does afterwards (the sessions' gauges).
    """
    with bridge_run(
        hub.server.url, transport, max_queue_size=THROUGHPUT_SPANS + 1000, max_export_batch_size=512
    ) as run:
        bridge = run.bridge
        with bridge.span("warm-up"):  # discovery / init happen on the export thread, before timing
            pass
        assert bridge.force_flush(30)
        per_session = 1 + 1 + 2 * 24  # session + task + 24 turns with one child each
        timed = (THROUGHPUT_SPANS // per_session) * per_session
        started: int | None = None
        for number in range(THROUGHPUT_SPANS // per_session):
            with bridge.session(sample=sample, session=f"s{number}", global_steps=1) as session:
                with session.task("t"):
                    for turn in range(24):
                        with session.turn(turn) as handle:
                            with bridge.span("tool"):
                                pass
                            if started is None:
                                started = time.perf_counter_ns()  # the first span ended just now
                            handle.record(prompt_tokens=1, completion_tokens=2, finish_reason="stop")
        produced = time.perf_counter_ns()
        assert started is not None
        # Decoding at the receiver runs in this process: for otlp, only once the bridge is done.
        assert bridge.force_flush(60 if transport == "otlp" else 180)
        spans = wait_for_run(hub.receiver, run, timed + 1, timeout_s=60)
        counters = bridge.status()["counters"]
    assert counters["ended"] == timed + 1 and balance(counters) == 0, counters
    assert counters["exported"] == {("rl_insight_otlp" if transport == "otlp" else "rl_insight"): timed + 1}, counters
    assert len(by_span_id(spans)) == timed + 1  # zero loss, zero duplicates
    timed_spans = [s for s in spans if s.name != "warm-up"]
    delivered = max(s.received_ns for s in timed_spans)
    return Throughput(timed_spans, (produced - started) / 1e9, (delivered - started) / 1e9)


def test_otlp_is_much_faster_than_the_hub_with_zero_loss(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    measured: dict[str, list[Throughput]] = {"hub": [], "otlp": []}
    for round_number in range(THROUGHPUT_ROUNDS):
        for transport in ("hub", "otlp"):
            result = _throughput(rl_insight_hub, transport, f"tput-{transport}-{round_number}-{run_tag}")
            assert_hierarchy(result.spans, real_links=transport == "otlp")
            measured[transport].append(result)
    hub = max(measured["hub"], key=lambda r: r.rate)
    otlp = max(measured["otlp"], key=lambda r: r.rate)
    speedup = otlp.rate / hub.rate
    rounds = "; ".join(f"{t}: " + ", ".join(f"{r.rate:,.0f}" for r in rs) for t, rs in measured.items())
    print(
        f"\nthroughput, {len(hub.spans)} spans each (first span end -> all at the receiver), best of "
        f"{THROUGHPUT_ROUNDS}: hub {hub.rate:,.0f} spans/s ({hub.delivered_s:.2f} s; caller loop "
        f"{hub.produced_s:.2f} s), otlp {otlp.rate:,.0f} spans/s ({otlp.delivered_s:.2f} s; caller loop "
        f"{otlp.produced_s:.2f} s), speedup {speedup:.1f}x [all rounds, spans/s: {rounds}]"
    )
    assert speedup >= MIN_SPEEDUP, f"otlp only {speedup:.1f}x the hub ({otlp.rate:.0f} vs {hub.rate:.0f} spans/s)"


# ------------------------------------------------------------------- bursts

#: A step's sessions finishing together: spans ended by this many threads at once, at default settings.
BURST_SPANS, BURST_THREADS = 20_000, 8


def test_a_burst_of_20000_spans_from_8_threads_reaches_rl_insight_whole_at_defaults(
    rl_insight_hub: RlInsightHub, run_tag: str
) -> None:
    """The byte-bounded queue (and the spill behind it) absorbs the burst: no span lost, none twice."""
    with bridge_run(rl_insight_hub.server.url, "otlp") as run:
        bridge = run.bridge
        with bridge.span("warm-up"):  # discovery and init on the export thread, before the burst
            pass
        assert bridge.force_flush(30)
        burst(bridge, BURST_SPANS, BURST_THREADS, tag=run_tag)
        assert bridge.force_flush(120)
        wait_until(lambda: bridge.status()["spill"]["backlog"] == 0, timeout_s=DELIVERY_TIMEOUT_S)
        assert bridge.force_flush(120)
        spans = wait_for_run(rl_insight_hub.receiver, run, BURST_SPANS + 1)
        counters = bridge.status()["counters"]
    assert balance(counters) == 0 and counters["dropped"] == 0, counters
    assert counters["exported"] == {"rl_insight_otlp": BURST_SPANS + 1}, counters
    assert len(by_span_id(spans)) == BURST_SPANS + 1  # every span once
    assert Counter(s.attributes["n"] for s in spans if s.name == "burst") == Counter(range(BURST_SPANS))
