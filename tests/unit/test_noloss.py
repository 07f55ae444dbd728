"""Nothing lost under bursts: the byte-bounded queue, the spill files and their drain, replay of a spill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import OtlpReceiver
from threads import burst

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.captures.read import read_records
from verl_otel_bridge._internal.pipeline.queue import span_size
from verl_otel_bridge._internal.records import record_to_span

from .helpers import WAIT_S, StartReceiver, assert_balanced, wait_until

pytest.importorskip("urllib3")

BURST_SPANS = 20_000
BURST_THREADS = 8


def _received(sink: OtlpReceiver) -> Counter[int]:
    return Counter(span.attributes["n"] for span in sink.spans)


def test_a_burst_of_20000_spans_from_8_threads_reaches_an_otlp_receiver_whole_at_defaults(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge]
) -> None:
    sink = start_receiver()
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url)

    burst(bridge, BURST_SPANS, BURST_THREADS)

    assert bridge.force_flush(60)
    wait_until(lambda: bridge.status()["spill"]["backlog"] == 0, what="the spill drained")
    assert bridge.force_flush(60)
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"otlp": BURST_SPANS} and counters["dropped"] == 0, counters
    assert _received(sink) == Counter(range(BURST_SPANS))  # every span once


def test_past_the_byte_bound_spans_spill_and_drain_without_loss(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge]
) -> None:
    """A queue of 1 MiB cannot hold a burst of 2 MB spans: the rest spill, then drain."""
    sink = start_receiver()
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url, max_queue_bytes=1024 * 1024)

    burst(bridge, 4_000, 4, payload="x" * 1000)

    assert bridge.force_flush(60)
    counters = bridge.status()["counters"]
    assert counters["dropped"] == 0 and counters["spill_written"] > 0, counters
    wait_until(lambda: bridge.status()["spill"]["backlog"] == 0, what="the spill drained")
    assert bridge.force_flush(60)
    assert assert_balanced(bridge)["exported"] == {"otlp": 4_000}
    assert _received(sink) == Counter(range(4_000))


def _closed_port() -> int:
    """A loopback port nothing listens on (yet)."""
    probe = OtlpReceiver()
    probe.stop()
    return probe.port


def _bridge_to_a_down_receiver(
    make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch, port: int | None = None, **settings: Any
) -> Bridge:
    """``exporter: otlp`` to a loopback port nothing listens on (``port``: a given one), a sender that gives a
    batch up after a second, and batches every 10 ms."""
    endpoint = f"http://127.0.0.1:{port or _closed_port()}/v1/traces"
    return make_bridge(exporter="otlp", otlp_endpoint=endpoint, otlp_timeout_s=1, schedule_delay_ms=10, **settings)


def test_spill_while_the_receiver_is_down_then_drain_with_nothing_lost_or_doubled(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    bridge = _bridge_to_a_down_receiver(
        make_bridge,
        monkeypatch,
        port,
        spill_after_s=1,
        spill_probe_s=0.2,  # "down for a minute", shortened
    )
    for n in range(1_000):
        with bridge.span("down", n=n):
            pass
    wait_until(lambda: bridge.status()["counters"]["spilled"] == 1_000, what="the refused batches spilled")
    for n in range(1_000, 3_000):  # the destination is down by now: straight to the spill
        with bridge.span("down", n=n):
            pass
    wait_until(lambda: bridge.status()["counters"]["spilled"] == 3_000, what="every span spilled")
    spill = bridge.status()["spill"]
    assert spill["backlog"] == 3_000 and spill["bytes"] > 0 and spill["file"] is not None
    assert Path(spill["file"]).parent == Path(bridge.config.spill_dir or spill["dir"])
    assert_balanced(bridge)

    sink = start_receiver(port=port)  # the receiver is back
    wait_until(lambda: bridge.status()["counters"]["exported"].get("otlp") == 3_000, what="the spill drained")
    assert bridge.force_flush(WAIT_S)
    counters = assert_balanced(bridge)
    assert (counters["spilled"], counters["dropped"], counters["failed"]) == (0, 0, 0), counters
    assert _received(sink) == Counter(range(3_000))  # nothing lost, nothing twice
    assert bridge.status()["spill"] == {**spill, "file": None, "files": [], "bytes": 0, "backlog": 0}
    assert not list(Path(spill["dir"]).glob("spill-*.jsonl"))  # drained files are deleted


def test_a_full_spill_drops_counted_and_warns_once_with_the_count(
    make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = _bridge_to_a_down_receiver(
        make_bridge, monkeypatch, spill_max_bytes=200_000, spill_after_s=0.1, spill_probe_s=60
    )
    for n in range(2_000):
        with bridge.span("s", n=n, payload="y" * 200):
            pass
    wait_until(lambda: bridge.status()["counters"]["spilled"] + bridge.status()["counters"]["dropped"] == 2_000)
    counters = assert_balanced(bridge)
    assert counters["dropped"] > 0 and counters["spilled"] > 0
    assert bridge.status()["spill"]["bytes"] <= 200_000
    warnings = [r.getMessage() for r in caplog.records if "spill is full" in r.getMessage()]
    assert len(warnings) == 1 and "spans dropped" in warnings[0]


def test_a_spill_file_replays_to_another_receiver(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bridge = _bridge_to_a_down_receiver(
        make_bridge, monkeypatch, spill_after_s=0.1, spill_probe_s=60, spill_dir=str(tmp_path / "spill")
    )
    for n in range(500):
        with bridge.span("kept for later", n=n):
            pass
    wait_until(lambda: bridge.status()["counters"]["spilled"] == 500)
    bridge.shutdown(timeout_s=2)
    (spill_file,) = (tmp_path / "spill").glob("spill-*.jsonl")
    records = read_records(spill_file).records
    assert sorted(r["attributes"]["n"] for r in records) == list(range(500))
    assert all(record_to_span(r).name == "kept for later" for r in records)

    sink = start_receiver()
    cli = Path(sys.executable).with_name("verl-otel-bridge")
    env = {**os.environ, "VERL_OTEL_BRIDGE_OTLP_ENDPOINT": sink.url}
    done = subprocess.run(
        [str(cli), "replay", str(spill_file), "--to", "otlp"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _received(sink) == Counter(range(500))


#: The script that measures it, in a process of its own (shared with bench/noloss.py).
RSS_PROBE = Path(__file__).resolve().parents[1] / "token_ids_rss.py"


def test_large_token_id_lists_keep_peak_memory_within_the_byte_bound(tmp_path: Path) -> None:
    """200 spans with 200,000-element token-id lists, the receiver down: about 1.6 GB without the bounds."""
    bound = 64 * 1024 * 1024
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_OTEL_BRIDGE_", "OTEL_"))}
    environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "2"
    settings = {
        "otlp_endpoint": f"http://127.0.0.1:{_closed_port()}/v1/traces",
        "max_queue_bytes": bound,
        "spill_max_bytes": 256 * 1024 * 1024,
        "spill_dir": str(tmp_path / "spill"),
    }
    done = subprocess.run(
        [sys.executable, str(RSS_PROBE), json.dumps(settings), "200"],
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    counters = result["counters"]
    assert counters["ended"] == 201 and counters["converted"] >= 201  # each list cut at max_attribute_items
    assert counters["spilled"] + counters["dropped"] + counters["failed"] == 201, counters
    # The documented bound: 1.25 x max_queue_bytes (queue and spill buffer) plus about 80 MiB of working
    # memory (batches being encoded, spilled and written, the caller's own lists, allocator slack).
    assert result["growth"] < 1.25 * bound + 96 * 1024 * 1024, result


def test_the_size_estimate_errs_high_for_token_id_lists(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.span("s", ids=list(range(100_000, 110_000)), text="z" * 5000):
        pass
    (span,) = bridge.memory_exporter.get_finished_spans() if bridge.memory_exporter else ()
    assert span_size(span) >= 10_000 * 40 + 5000
