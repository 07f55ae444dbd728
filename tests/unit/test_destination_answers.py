"""What destinations answer is read and said truthfully: partial successes, secrets never shown, status after
shutdown, where each destination writes, and nothing abandoned at exit when the destination does not answer."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, ConfigError
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge.cli import app as cli

from .helpers import WAIT_S, StartReceiver, assert_balanced, wait_until

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-T0KEN-value"


def quotes_secret(text: str) -> bool:
    """Whether ``text`` shows the secret in any case (a header name is lower-cased when parsed)."""
    return SECRET.lower() in text.lower()


def _rejecting(count: int, message: str) -> Callable[[dict[str, str], bytes], bytes]:
    """An answer body: 200 with a partial success rejecting ``count`` spans."""
    answer = ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(rejected_spans=count, error_message=message)
    ).SerializeToString()
    return lambda headers, body: answer


def _spans(bridge: Bridge, count: int) -> None:
    for i in range(count):
        with bridge.span("s", i=i):
            pass


# -- 32.4: OTLP answers are read -------------------------------------------------------------


def test_spans_a_partial_success_rejects_are_failed_named_and_warned_once(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    sink = start_receiver(reply=_rejecting(3, "attribute too long"))
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url, schedule_delay_ms=10, max_export_batch_size=5)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            _spans(bridge, 5)
            assert bridge.flush_queued(WAIT_S)
    counters = assert_balanced(bridge)
    assert (counters["exported"], counters["failed"]) == ({"otlp": 4}, 6), counters  # 5 sent, 3 rejected, twice
    last_error = bridge.status()["exporters"]["otlp"]["last_error"]
    assert "rejected 3 of 5 spans" in last_error and "attribute too long" in last_error, last_error
    warned = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warned) == 1, warned  # one WARNING per destination


def test_an_empty_partial_success_is_a_success(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge]
) -> None:
    sink = start_receiver(reply=lambda headers, body: ExportTraceServiceResponse().SerializeToString())
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url, schedule_delay_ms=10)
    _spans(bridge, 3)
    assert bridge.force_flush(WAIT_S)
    assert assert_balanced(bridge)["exported"] == {"otlp": 3}
    assert bridge.status()["exporters"]["otlp"]["last_error"] is None


# -- 32.5: one masking rule for everything shown about a destination ------------------------------


def _shown(bridge: Bridge, caplog: pytest.LogCaptureFixture) -> str:
    status = bridge.status()
    return "\n".join([json.dumps(status), str(status), caplog.text, *(r.getMessage() for r in caplog.records)])


def test_a_header_value_echoed_in_an_answer_never_shows(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    sink = start_receiver(status=401, reply=lambda headers, body: f"bad token: {headers['authorization']}".encode())
    with caplog.at_level(logging.INFO):
        bridge = make_bridge(
            exporter="otlp",
            otlp_endpoint=sink.url,
            environ={"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{SECRET}"},
            schedule_delay_ms=10,
            spill_max_bytes=0,
        )
        _spans(bridge, 2)
        assert bridge.force_flush(WAIT_S)
    assert sink.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # sent...
    last_error = bridge.status()["exporters"]["otlp"]["last_error"]
    assert "401" in last_error and "bad token: ***" in last_error, last_error
    assert not quotes_secret(_shown(bridge, caplog))  # ...never shown


def test_a_key_in_the_endpoints_query_never_shows(
    start_receiver: StartReceiver,
    make_bridge: Callable[..., Bridge],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = start_receiver(status=403)
    endpoint = f"{sink.url}?api_key={SECRET}"
    with caplog.at_level(logging.INFO):
        bridge = make_bridge(exporter="otlp", otlp_endpoint=endpoint, schedule_delay_ms=10, spill_max_bytes=0)
        _spans(bridge, 2)
        assert bridge.force_flush(WAIT_S)
    assert sink.requests[0].path.endswith(f"?api_key={SECRET}")  # sent...
    assert bridge.status()["exporters"]["otlp"]["endpoint"] == f"{sink.url}?***"
    assert not quotes_secret(_shown(bridge, caplog))  # ...never shown
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "otlp")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    for arguments in (["doctor"], ["doctor", "--json"]):
        result = CliRunner().invoke(cli.build_cli(), arguments, catch_exceptions=False)
        assert not quotes_secret(result.output), result.output
    assert f"{sink.url}?***" in result.output  # the JSON report names the endpoint, its query masked


def test_a_malformed_header_never_quotes_its_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization: Basic {SECRET}==")
    with pytest.raises(ConfigError) as raised:
        vob.configure(exporter="memory")
    assert "OTEL_EXPORTER_OTLP_HEADERS" in str(raised.value) and not quotes_secret(str(raised.value))


def test_a_worker_bridge_with_a_malformed_header_logs_without_the_token(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization: Basic {SECRET}==")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory")
    vob.shutdown()
    monkeypatch.setattr("verl_otel_bridge._internal.current._current", None)
    with caplog.at_level(logging.ERROR):
        with vob.span("made by a span: the bridge comes from the environment, leniently"):
            pass
    assert "otlp_headers" in caplog.text and not quotes_secret(caplog.text)
    assert vob.get_bridge().config.exporter == "memory"  # the other settings stay in force


# -- 35: OTEL_TRACES_EXPORTER and the OTLP variables are settings like the bridge's own ------------


def test_otel_traces_exporter_console_is_honoured_by_configure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_", "RL_INSIGHT_"))}
    script = "import verl_otel_bridge as vob\nvob.configure()\nwith vob.span('hello'):\n    pass\nvob.shutdown()\n"
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "OTEL_TRACES_EXPORTER": "console", "VERL_OTEL_BRIDGE_CONSOLE_FORMAT": "json"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["name"] == "hello"


def test_a_bad_otlp_timeout_is_a_config_error_and_leaves_the_rest_in_force(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "ten")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(tmp_path / "spans.jsonl"))
    with pytest.raises(ConfigError, match=r"OTEL_EXPORTER_OTLP_TIMEOUT = 'ten'") as raised:
        vob.configure()
    assert raised.value.key == "otlp_timeout_s"
    monkeypatch.setattr("verl_otel_bridge._internal.current._current", None)
    with caplog.at_level(logging.ERROR):
        bridge = vob.get_bridge()  # as a span would make it
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in caplog.text
    assert (bridge.enabled, bridge.config.exporter, bridge.config.otlp_timeout_s) == (True, "jsonl", None)
    bridge.shutdown()


# -- 34.1: status() tells the truth after shutdown; every destination says where it writes -------


def test_status_after_shutdown_is_that_bridges_final_account(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    vob.configure(exporter="jsonl", jsonl_path=str(path))
    with vob.session(sample=0, session=0):
        for i in range(5):
            with vob.span("s", i=i):
                pass
    vob.shutdown()
    status = vob.status()
    assert status["shut_down"] is True and status["exporter"] == "jsonl"
    assert status["counters"]["ended"] == 6 and status["counters"]["exported"] == {"jsonl": 6}
    assert "spans went to jsonl" in str(status) and "shut down" in str(status)
    assert len(path.read_text().splitlines()) == 6
    with vob.span("after"):  # a span made now gets a new bridge, which status() then describes
        pass
    assert vob.status()["shut_down"] is False


@pytest.mark.parametrize("role", ["primary", "copy"])
def test_the_jsonl_path_shows_as_opened(make_bridge: Callable[..., Bridge], tmp_path: Path, role: str) -> None:
    given = str(tmp_path / "c2-{pid}.jsonl")
    exporter = "jsonl" if role == "primary" else "auto,jsonl"
    bridge = make_bridge(exporter=exporter, jsonl_path=given)
    _spans(bridge, 1)
    assert bridge.force_flush(WAIT_S)
    entry = bridge.status()["exporters"]["jsonl"]
    opened = str(tmp_path / f"c2-{os.getpid()}.jsonl")
    assert (entry["role"], entry["path"]) == (role, opened)
    assert Path(opened).read_text().count("\n") == 1
    assert f"-> {opened}" in str(bridge.status())


# -- 34.2: nothing abandoned at exit when the destination does not answer -------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


DEAD_AT_EXIT = """
import sys
import verl_otel_bridge as vob
vob.configure(exporter="otlp", otlp_endpoint=sys.argv[1], spill_dir=sys.argv[2], shutdown_timeout_s=float(sys.argv[3]))
for i in range(2000):
    with vob.span("s", i=i):
        pass
"""


def test_a_dead_destination_at_exit_leaves_every_queued_span_in_the_spill_for_replay(
    tmp_path: Path, start_receiver: StartReceiver
) -> None:
    port, spill, bound_s = _free_port(), tmp_path / "spill", 10.0
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_", "RL_INSIGHT_"))}
    result = subprocess.run(
        [sys.executable, "-c", DEAD_AT_EXIT, endpoint, str(spill), str(bound_s)],
        env={**env, "NO_PROXY": "127.0.0.1"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # Nothing abandoned: the export ended within the shutdown bound, every queued span in the spill.
    assert "abandoned" not in result.stderr and "2000 spans are left in the spill" in result.stderr, result.stderr
    (file,) = spill.glob("spill-*.jsonl")
    assert len(file.read_text().splitlines()) == 2000
    sink = start_receiver(port=port)  # the destination is back: replay sends each span once
    replayed = CliRunner().invoke(cli.build_cli(), ["replay", str(file), "--to", "otlp"], env={
        "VERL_OTEL_BRIDGE_OTLP_ENDPOINT": endpoint, "NO_PROXY": "127.0.0.1"})  # fmt: skip
    assert replayed.exit_code == 0, replayed.output
    wait_until(lambda: len(sink.spans) == 2000, what="the replayed spans")
    assert sorted(int(s.attributes["i"]) for s in sink.spans) == list(range(2000))


def test_force_flush_keeps_its_timeout_when_the_destination_is_known_down(make_bridge: Callable[..., Bridge]) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}/v1/traces"
    # A send retries for 3 s; the destination counts as down only after spill_after_s (60 s); batches wait for a flush.
    bridge = make_bridge(exporter="otlp", otlp_endpoint=endpoint, otlp_timeout_s=3, schedule_delay_ms=600_000)
    _spans(bridge, 10)
    assert bridge.force_flush(WAIT_S)  # the first batch is refused (after its retries) and spilled
    assert bridge.status()["counters"]["spilled"] == 10
    _spans(bridge, 500)
    assert bridge.force_flush(1.0)  # not tried again while the flush waits: spilled at once
    counters: dict[str, Any] = bridge.status()["counters"]
    assert counters["spilled"] == 510 and balance(counters) == 0, counters
