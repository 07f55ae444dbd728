"""The ``verl-otel-bridge`` command line: doctor, show, replay, demo."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.records import record_to_span, span_to_record
from verl_otel_bridge._internal.secrets import mask_url, masked
from verl_otel_bridge._version import install_command
from verl_otel_bridge.cli import app as cli
from verl_otel_bridge.cli import demo, doctor

from .fake_rl_insight import install_ray, install_rl_insight
from .helpers import StartReceiver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at the terminal width; a wide one keeps each report line on one line."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.build_cli(), list(args), catch_exceptions=False)


@pytest.fixture
def rl_insight_server(start_receiver: StartReceiver) -> str:
    """An RL-Insight-like discovery API on 127.0.0.1 (``GET /api/v1/services``), advertising its own OTLP port."""
    return start_receiver().base_url


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def doctor_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run("doctor", "--json", *args)
    return result.exit_code, json.loads(result.stdout)


# -- doctor ------------------------------------------------------------------------


def test_doctor_fails_when_rl_insight_is_wanted_but_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    result = run("doctor")
    assert result.exit_code == 1, result.output
    assert "memory (fallback)" in result.output
    assert "not_installed" in result.output
    assert install_command("rl-insight") in result.output
    assert "NOT OK" in result.output


def test_doctor_passes_with_a_local_exporter_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory")
    result = run("doctor")
    assert result.exit_code == 0, result.output
    assert "exporter='memory' configured" in result.output
    assert "OK: spans reach memory" in result.output


def test_doctor_under_plain_auto_without_rl_insight_is_ok_with_a_note() -> None:
    """The local fallback under plain ``auto`` is the expected state (at runtime only an INFO), not a failure."""
    code, report = doctor_json()
    assert code == 0 and report["ok"] is True and report["problems"] == []
    assert report["route"]["preferred"] == "rl_insight"
    assert report["route"]["destination"] == "memory (fallback)"
    assert report["route"]["rl_insight_wanted"] == "if usable"
    assert any("not_installed" in note and "as exporter=auto intends" in note for note in report["notes"])
    assert any(note.startswith("to send them to RL-Insight: install RL-Insight") for note in report["notes"])
    text = run("doctor")
    assert text.exit_code == 0 and "OK: spans reach memory (fallback)" in text.output and "NOT OK" not in text.output
    assert "note: to send them to RL-Insight" in text.output


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "soon"])
def test_doctor_rejects_a_timeout_that_is_not_a_positive_number(timeout: str) -> None:
    result = run("doctor", "--timeout", timeout)
    assert result.exit_code == 2, result.output
    assert "--timeout" in result.output and "Traceback" not in result.output


def test_doctor_shows_the_spill_directory_status_uses(make_bridge: Callable[..., Bridge]) -> None:
    _, report = doctor_json()
    status = make_bridge().status()
    assert status["spill"] is not None
    assert report["config"]["values"]["spill_dir"] == {"value": status["spill"]["dir"], "source": "default"}


def test_doctor_json_shows_values_and_their_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_PROJECT", "gsm8k")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "0")
    code, report = doctor_json()
    values = report["config"]["values"]
    assert set(values) == set(BridgeConfig.keys())
    assert values["project"] == {"value": "gsm8k", "source": "environment VERL_OTEL_BRIDGE_PROJECT"}
    assert values["service_name"] == {"value": "trainer", "source": "environment OTEL_SERVICE_NAME"}
    assert values["rl_insight_enable"] == {"value": False, "source": "environment VERL_RL_INSIGHT_ENABLE"}
    assert values["exporter"] == {"value": "auto", "source": "default"}
    # auto with RL-Insight switched off is a deliberate local choice
    assert report["route"]["rl_insight_wanted"] == "no"
    assert report["route"]["destination"] == report["route"]["preferred"] == "memory"
    assert code == 0 and report["ok"] is True
    for name in ("opentelemetry-api", "opentelemetry-sdk"):
        assert report["versions"][name]
    assert report["versions"]["rl-insight"] is None and report["versions"]["ray"] is None


def test_doctor_reports_a_bad_configuration_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "tempo")
    result = run("doctor")
    assert result.exit_code == 1
    assert "configuration error" in result.output and "tempo" in result.output
    assert "Traceback" not in result.output
    code, report = doctor_json()
    assert code == 1 and report["route"] is None
    assert report["config"]["values"]["exporter"]["source"] == "environment VERL_OTEL_BRIDGE_EXPORTER"


def test_doctor_shows_a_reachable_server_and_its_otlp_port(
    monkeypatch: pytest.MonkeyPatch, rl_insight_server: str
) -> None:
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", rl_insight_server)
    result = run("doctor")
    assert f"{rl_insight_server}: reachable" in result.output
    port = int(rl_insight_server.rsplit(":", 1)[1])
    assert f"otlp_port={port}" in result.output
    code, report = doctor_json()
    assert report["server"]["reachable"] is True
    assert report["server"]["otlp_port"] == port
    assert report["server"]["trace_endpoint"] == f"{rl_insight_server}/v1/traces"
    # the server answers, but RL-Insight itself is not installed here: under plain auto that is a note
    assert code == 0 and any("not_installed" in note for note in report["notes"])


def test_doctor_passes_when_rl_insight_is_usable_and_the_server_answers(
    monkeypatch: pytest.MonkeyPatch, rl_insight_server: str
) -> None:
    fake = install_rl_insight(monkeypatch, "0.3.0")
    install_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", rl_insight_server)
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    code, report = doctor_json()
    assert code == 0, report
    assert report["route"]["destination"] == "rl_insight"
    assert report["route"]["reason"] == "ok"
    assert report["versions"]["rl_insight.__version__"] == "0.3.0"
    assert report["versions"]["rl-insight"] == "0.3.0"
    assert fake.init_calls == []  # doctor checks; it never initialises RL-Insight


def test_doctor_assumes_ray_is_initialised_by_the_training_job(
    monkeypatch: pytest.MonkeyPatch, rl_insight_server: str
) -> None:
    install_rl_insight(monkeypatch, "0.3.0")
    real = doctor.distribution_version
    monkeypatch.setattr(doctor, "distribution_version", lambda name: "2.40.0" if name == "ray" else real(name))
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", rl_insight_server)
    before = sys.modules.get("ray", "absent")
    code, report = doctor_json()
    assert code == 0, report
    assert "ray 2.40.0 is installed" in report["route"]["ray"]
    assert sys.modules.get("ray", "absent") is before  # nothing of Ray was imported or replaced


def test_doctor_fails_when_the_server_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    install_rl_insight(monkeypatch, "0.3.0")
    install_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", f"http://127.0.0.1:{closed_port()}")
    code, report = doctor_json("--timeout", "1")
    assert code == 1
    assert report["server"]["reachable"] is False
    assert any("does not answer" in problem for problem in report["problems"])


@pytest.mark.parametrize("as_json", [False, True])
def test_doctor_never_prints_secrets(monkeypatch: pytest.MonkeyPatch, as_json: bool) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_RL_INSIGHT_SERVER_URL", "http://user:s3cret@127.0.0.1:1")
    monkeypatch.setenv(
        "VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG",
        json.dumps({"server": {"auth_token": "t0ken-value"}, "otel": {"headers": "authorization=Basic aGVsbG8="}}),
    )
    monkeypatch.setenv("VERL_OTEL_BRIDGE_OTLP_ENDPOINT", "https://me:pa55word@127.0.0.1:1/v1/traces")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory,otlp")
    result = run("doctor", *(["--json"] if as_json else []))
    for secret in ("s3cret", "t0ken-value", "aGVsbG8", "pa55word"):
        assert secret not in result.output
    assert "127.0.0.1:1" in result.output  # the rest of the URL is still shown


def test_doctor_hides_secrets_even_when_the_configuration_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG", '{"password": "hunter22"')  # not JSON
    result = run("doctor")
    assert result.exit_code == 1
    assert "hunter22" not in result.output


def test_masking_rules() -> None:
    assert mask_url("see http://u:p@host:1/x and https://tok@h") == "see http://***@host:1/x and https://***@h"
    assert masked("rl_insight_config", {"Server": {"X-Api-Token": "a", "url": "http://a:b@c"}, "n": 1}) == {
        "Server": {"X-Api-Token": "***", "url": "http://***@c"},
        "n": 1,
    }
    assert masked("otel_headers", ["a", "b"]) == "***"
    assert masked("project", None) is None


# -- show --------------------------------------------------------------------------


def make_capture(path: Path, make_bridge: Callable[..., Bridge]) -> list[dict[str, Any]]:
    """Two sessions (5 spans) written by the jsonl exporter, one failing; returns the records in file order."""
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path), project="gsm8k", experiment_name="run-7")
    vob.set_bridge(bridge)
    with vob.session(sample=3, session=1, global_steps=12, uid="u3") as s:
        with s.task("solve") as task:
            with s.turn(0) as turn:
                turn.record(prompt_tokens=120, completion_tokens=48, finish_reason="stop", tools=["search", "python"])
            task.set_result(status="success", reward=1.0)
        end = time.time_ns()
        vob.record_span(
            "reward_model", start_time_ns=end - 2_000_001, end_time_ns=end, attributes={"scores": [0.5, 1.5]}
        )
    with pytest.raises(ValueError), vob.session(sample=4, session=0):
        raise ValueError("bad reward")
    assert bridge.force_flush(10)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 5
    return records


def test_show_prints_the_nested_tree(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    result = run("show", str(capture))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("agent_session [") and "sample=3 session=1" in lines[0]
    assert any(line.startswith("  agent_task [") for line in lines)
    turn = next(line for line in lines if "agent_turn" in line)
    assert turn.startswith("    agent_turn [") and "prompt_tokens=120" in turn
    assert any(line.startswith("agent_session [") and "ERROR" in line for line in lines)
    assert "5 spans in 2 traces; 0 bad lines" in result.stderr


def test_show_counts_bad_lines_without_failing(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    with capture.open("a") as f:
        f.write('{"name": "truncated", "span_id": "00\n\n[1, 2]\n{"no": "name"}\n')
    result = run("show", str(capture), "--max-attributes", "0")
    assert result.exit_code == 0
    assert "5 spans in 2 traces; 3 bad lines" in result.stderr
    assert f"{capture}:6: not JSON" in result.stderr  # file:line:, as report says it
    assert f"{capture}:8: a JSON list, not a span record" in result.stderr
    assert "prompt_tokens" not in result.stdout  # --max-attributes 0
    reported = run("report", str(capture))
    assert f"{capture}:6: not JSON" in reported.stdout


def test_show_and_report_take_several_files_and_directories(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    """As the Ray example writes them: one capture per process, given as files or as their directory."""
    workers = tmp_path / "workers"
    workers.mkdir()
    make_capture(workers / "a.jsonl", make_bridge)
    make_capture(workers / "b.jsonl", make_bridge)
    (workers / "notes.txt").write_text("not a capture, and not *.jsonl: skipped and said\n")
    for args in ([str(workers / "a.jsonl"), str(workers / "b.jsonl")], [str(workers)]):
        shown = run("show", *args)
        assert shown.exit_code == 0, shown.output
        assert "10 spans in 4 traces; 0 bad lines" in shown.stderr
        reported = run("report", *args)
        assert reported.exit_code == 0, reported.output
        assert "from 2 files" in reported.stdout
    empty = tmp_path / "nothing"
    empty.mkdir()
    for command in ("show", "report"):
        result = run(command, str(empty))
        assert result.exit_code == 1 and "no span record" in result.output


@pytest.mark.parametrize("content", ["", "# verl-otel-bridge\n\nOpenTelemetry tracing for verl.\n"])
def test_show_and_report_refuse_a_file_that_is_not_a_capture(tmp_path: Path, content: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(content)
    for command in ("show", "report"):
        result = run(command, str(readme))
        assert result.exit_code == 1, (command, result.output)
        assert "no span record" in result.output and str(readme) in result.output


def test_report_of_an_unknown_step_names_the_steps_present(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)  # sessions of step 12 and one without a step
    result = run("report", str(capture), "--step", "99")
    assert result.exit_code == 1, result.output
    assert "no step 99 in these captures; the steps present: 12, (no global_steps)" in result.output
    assert run("report", str(capture), "--step", "12").exit_code == 0


def test_report_checks_the_html_path_before_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture = tmp_path / "spans.jsonl"
    capture.write_text("")
    built: list[object] = []
    monkeypatch.setattr("verl_otel_bridge.report.build_report", lambda *a, **k: built.append(a))
    for target, says in (
        (tmp_path / "no" / "such" / "r.html", "does not exist"),
        (tmp_path, "is a directory"),
    ):
        result = run("report", str(capture), "--html", str(target))
        assert result.exit_code == 2, result.output
        assert "--html" in result.output and says in result.output
    assert built == []  # nothing was read before the path was refused


# -- records <-> spans ---------------------------------------------------------------


def test_record_to_span_round_trips_a_real_capture(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    records = make_capture(tmp_path / "spans.jsonl", make_bridge)
    for record in records:
        span = record_to_span(record)
        assert span_to_record(span) == record
    failed = next(r for r in records if r["status"]["code"] == "ERROR")
    assert failed["status"]["description"] == "ValueError: bad reward"
    assert [e["name"] for e in failed["events"]] == ["exception"]


_scalar = st.one_of(
    st.text(max_size=8),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
_value = st.one_of(
    _scalar,
    st.lists(st.text(max_size=4), max_size=3),
    st.lists(st.integers(min_value=0, max_value=9), max_size=3),
    st.lists(st.booleans(), max_size=3),
)
_attributes = st.dictionaries(st.text(min_size=1, max_size=8), _value, max_size=5)
_hex = lambda n: st.integers(min_value=1, max_value=16**n - 1).map(lambda v: format(v, f"0{n}x"))  # noqa: E731


@st.composite
def span_records(draw: st.DrawFn) -> dict[str, Any]:
    start = draw(st.integers(min_value=10**18, max_value=2 * 10**18))
    code = draw(st.sampled_from(["UNSET", "OK", "ERROR"]))
    return {
        "name": draw(st.text(min_size=1, max_size=10)),
        "trace_id": draw(_hex(32)),
        "span_id": draw(_hex(16)),
        "parent_span_id": draw(st.none() | _hex(16)),
        "start_time_ns": start,
        "end_time_ns": start + draw(st.integers(min_value=0, max_value=10**12)),
        "kind": draw(st.sampled_from(["INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"])),
        "status": {"code": code, "description": draw(st.text(min_size=1, max_size=10)) if code == "ERROR" else None},
        "attributes": draw(_attributes),
        "events": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.text(max_size=6),
                        "time_ns": st.integers(min_value=0, max_value=2**63),
                        "attributes": _attributes,
                    }
                ),
                max_size=2,
            )
        ),
        "resource": draw(_attributes),
        "scope": draw(st.none() | st.text(max_size=6)),
    }


@settings(max_examples=200, deadline=None)
@given(span_records())
def test_record_to_span_round_trips_any_record(record: dict[str, Any]) -> None:
    assert span_to_record(record_to_span(record)) == record
    # and through JSON, as the jsonl exporter writes it
    text = json.dumps(record, ensure_ascii=False)
    assert span_to_record(record_to_span(json.loads(text))) == json.loads(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trace_id": "xyz"}, "trace_id"),
        ({"span_id": "0" * 15}, "span_id"),
        ({"start_time_ns": 1.5}, "start_time_ns"),
        ({"kind": "SIDEWAYS"}, "SIDEWAYS"),
        ({"status": {"code": "FINE"}}, "FINE"),
        ({"attributes": [1]}, "attributes"),
    ],
)
def test_record_to_span_rejects_bad_records(change: dict[str, Any], message: str) -> None:
    record = {
        "name": "x",
        "trace_id": "1" * 32,
        "span_id": "2" * 16,
        "parent_span_id": None,
        "start_time_ns": 1,
        "end_time_ns": 2,
        "attributes": {},
    }
    with pytest.raises(ValueError, match=message):
        record_to_span({**record, **change})


# -- replay ------------------------------------------------------------------------


def summary_row(stderr: str) -> dict[str, int]:
    """The numbers of ``replay``'s summary table."""
    row = next(line for line in stderr.splitlines() if re.fullmatch(r"[│\s\d]+", line) and re.search(r"\d", line))
    numbers = [int(cell) for cell in row.strip().strip("│").split("│")]
    return dict(zip(["read", "bad lines", "exported", "fallback", "failed"], numbers, strict=True))


def test_replay_to_console_re_exports_every_span_exactly(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    capture = tmp_path / "spans.jsonl"
    records = make_capture(capture, make_bridge)
    with capture.open("a") as f:
        f.write("not json\n")
        f.write(json.dumps({**records[0], "trace_id": "nothex"}) + "\n")
    result = run("replay", str(capture), "--to", "console", "--batch-size", "4")
    assert result.exit_code == 0, result.output
    replayed = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert replayed == records  # same ids, parents, ns times, status, attributes, events, resource
    summary = result.stderr
    assert summary_row(summary) == {"read": 5, "bad lines": 2, "exported": 5, "fallback": 0, "failed": 0}
    assert f"{capture}:6: not JSON" in summary and f"{capture}:7: trace_id" in summary


def test_replay_applies_redact_attributes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    capture = tmp_path / "spans.jsonl"
    records = make_capture(capture, make_bridge)
    secret = next(key for record in records for key in record["attributes"] if key.endswith("tools"))
    monkeypatch.setenv("VERL_OTEL_BRIDGE_REDACT_ATTRIBUTES", secret)
    result = run("replay", str(capture), "--to", "console")
    assert result.exit_code == 0, result.output
    replayed = {r["span_id"]: r for r in (json.loads(line) for line in result.stdout.splitlines() if line.strip())}
    assert set(replayed) == {r["span_id"] for r in records}
    for record in records:
        expected = {k: ("[REDACTED]" if k == secret else v) for k, v in record["attributes"].items()}
        assert replayed[record["span_id"]]["attributes"] == expected
    assert any(secret in r["attributes"] for r in records)


def test_replay_to_rl_insight_forwards_with_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    capture = tmp_path / "spans.jsonl"
    records = make_capture(capture, make_bridge)
    fake = install_rl_insight(monkeypatch, "0.3.0")
    install_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_RL_INSIGHT_TRANSPORT", "hub")
    result = run("replay", str(capture), "--to", "rl_insight", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    calls = {call.attributes["otel.span_id"]: call for call in fake.calls}
    assert set(calls) == {r["span_id"] for r in records}
    for record in records:
        call = calls[record["span_id"]]
        assert (call.name, call.start_time_ns, call.end_time_ns) == (
            record["name"],
            record["start_time_ns"],
            record["end_time_ns"],
        )
        assert call.attributes["otel.trace_id"] == record["trace_id"]
        assert call.attributes["otel.parent_span_id"] == (record["parent_span_id"] or "")
    assert len(fake.init_calls) == 1


def test_replay_to_unusable_rl_insight_says_where_spans_went(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    result = run("replay", str(capture), "--to", "rl_insight")
    assert result.exit_code == 1
    assert summary_row(result.stderr) == {"read": 5, "bad lines": 0, "exported": 0, "fallback": 5, "failed": 0}
    assert "not usable (not_installed)" in result.stderr
    assert "memory fallback and are gone when this command exits" in result.stderr


class _StartableRay(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("ray")
        self.initialized = False
        self.init_kwargs: list[dict[str, Any]] = []
        self.shutdowns = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: Any) -> None:
        self.init_kwargs.append(kwargs)
        self.initialized = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False


@pytest.mark.parametrize("init_ray", [True, False])
def test_replay_to_rl_insight_starts_ray_only_when_needed_and_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_bridge: Callable[..., Bridge], init_ray: bool
) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    fake = install_rl_insight(monkeypatch, "0.3.0")
    ray = _StartableRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_RL_INSIGHT_TRANSPORT", "hub")
    result = run("replay", str(capture), "--to", "rl_insight", "--init-ray" if init_ray else "--no-init-ray")
    if init_ray:
        assert result.exit_code == 0, result.output
        assert len(ray.init_kwargs) == 1 and ray.shutdowns == 1
        assert len(fake.calls) == 5
    else:
        assert result.exit_code == 1
        assert ray.init_kwargs == [] and fake.calls == []
        assert "ray_not_initialized" in result.stderr


def test_replay_reports_an_exporter_that_cannot_be_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_FALLBACK", "jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(blocker / "spans.jsonl"))
    result = run("replay", str(capture), "--to", "rl_insight")
    assert result.exit_code == 2
    assert "cannot be opened for appending" in result.stderr


def test_doctor_flags_an_unwritable_jsonl_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory,jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(blocker / "spans.jsonl"))
    code, report = doctor_json()
    assert code == 1
    assert report["route"]["copies"][0]["ok"] is False
    assert any("copy 'jsonl' cannot be used" in problem for problem in report["problems"])
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(tmp_path / "new-dir" / "spans.jsonl"))
    code, report = doctor_json()
    assert code == 0, report["problems"]
    assert not (tmp_path / "new-dir").exists()  # doctor checks, it creates nothing


def test_replay_reports_a_missing_otlp_dependency(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    capture = tmp_path / "spans.jsonl"
    make_capture(capture, make_bridge)
    monkeypatch.setitem(sys.modules, "urllib3", None)
    result = run("replay", str(capture), "--to", "otlp")
    assert result.exit_code == 2
    assert install_command("otlp") in result.stderr


# -- entry point, demo ---------------------------------------------------------------


@pytest.mark.parametrize("missing", ["click", "rich"])
def test_missing_cli_extra_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["doctor"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"needs {missing!r}" in err and install_command("cli") in err


def test_missing_cli_extra_in_a_fresh_process() -> None:
    code = "import sys; sys.modules['click'] = None; from verl_otel_bridge.cli import main; main(['doctor'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "verl-otel-bridge: the command line needs 'click', which is not installed; "
        f"install it with: {install_command('cli')}"
    ]


def test_demo_command_runs_the_demo_keeps_its_output_and_its_printed_commands_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory")  # whatever RL-Insight this machine has
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "verl_otel_bridge.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    capture = Path("demo-output") / demo.CAPTURE_NAME
    headline = done.stdout.splitlines()[0]
    # every destination, the JSON Lines copy too, named once
    assert (
        headline
        == f"{demo.SESSIONS} sessions done; spans went to: memory (exporter='memory' configured; JSON Lines to {capture})"
    )
    tree = done.stdout[: done.stdout.index("status():")]
    assert "    agent_turn [" in tree and "agent_session.progress" not in tree  # the straggler's tree, no progress
    assert "  exporters:\n    memory  primary" in done.stdout  # status() printed for people
    report = done.stdout[done.stdout.index(f"the report of {capture}") :]  # the end: the report of the run
    straggler, group = demo.STRAGGLER, demo.SOLVED_BY_ALL
    assert f"straggler: uid 'uid-{straggler[0]}' sample {straggler[0]} session {straggler[1]}:" in report
    assert f"zero advantage: uid 'uid-{group}': all {demo.GROUP} sessions got reward 1" in report
    assert "ToolError: search failed" in report

    # What it kept survives the run, and the two commands it ends with work when pasted in that shell.
    kept = tmp_path / "demo-output"
    assert json.loads((kept / "status.json").read_text())["counters"]["ended"] > demo.SESSIONS
    commands = done.stdout.strip().splitlines()[-2:]
    assert commands == [
        f"  verl-otel-bridge report {capture}",
        f"  verl-otel-bridge report {capture} --html {Path('demo-output') / 'report.html'}",
    ]
    for command in commands:
        again = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert f"zero advantage: uid 'uid-{group}'" in again.stdout
    assert "straggler" in (kept / "report.html").read_text(encoding="utf-8")


def test_demo_commands_name_this_environments_script_when_it_is_not_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``make demo`` runs ``.venv/bin/python``; the shell it returns to has no ``.venv/bin`` on ``PATH``."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(Path(sys.executable).parent.parent.parent)
    prefix = demo.command_prefix()
    assert prefix != "verl-otel-bridge" and prefix.endswith("verl-otel-bridge")
    assert (Path.cwd() / prefix).exists() or Path(prefix).exists()


def test_demo_output_refuses_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "demo-output").symlink_to(target)
    with pytest.raises(SystemExit, match="is a symbolic link"):
        demo.prepare_output(tmp_path / "demo-output")
    (tmp_path / "demo-output").unlink()
    demo.prepare_output(tmp_path / "demo-output")
    assert (tmp_path / "demo-output").stat().st_mode & 0o777 == 0o700
