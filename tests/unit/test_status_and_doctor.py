"""Refusals are visible: ``status()`` per exporter and ``doctor`` asking each OTLP endpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import pytest
from click.testing import CliRunner

from verl_otel_bridge import Bridge
from verl_otel_bridge.cli import app as cli

from .helpers import StartReceiver


def doctor(monkeypatch: pytest.MonkeyPatch, endpoint: str, headers: str = "") -> tuple[int, dict[str, Any], str]:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "otlp")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", headers)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    as_json = CliRunner().invoke(cli.build_cli(), ["doctor", "--json"], catch_exceptions=False)
    text = CliRunner().invoke(cli.build_cli(), ["doctor"], catch_exceptions=False)
    assert as_json.exit_code == text.exit_code
    return as_json.exit_code, json.loads(as_json.stdout), text.output


def test_doctor_sends_an_empty_export_request_with_the_configured_headers(
    monkeypatch: pytest.MonkeyPatch, start_receiver: StartReceiver
) -> None:
    sink = start_receiver()
    code, report, text = doctor(monkeypatch, sink.url, "x-api-key=k1")
    assert code == 0, text
    assert report["route"]["local"]["detail"] == f"OTLP/HTTP to {sink.url}: accepts OTLP export requests"
    assert [(r.path, r.body, r.headers["x-api-key"]) for r in sink.requests] == [("/v1/traces", b"\n\x00", "k1")] * 2
    assert "OK: spans reach otlp" in text


@pytest.mark.parametrize(
    ("status", "fix"),
    [(403, "wants credentials"), (404, "usually ends in /v1/traces"), (415, "does not take OTLP/HTTP protobuf")],
)
def test_doctor_fails_with_the_servers_answer_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, start_receiver: StartReceiver, status: int, fix: str
) -> None:
    sink = start_receiver(status=status)
    code, report, text = doctor(monkeypatch, sink.url)
    assert code == 1
    assert f"answered {status} " in report["route"]["local"]["detail"] and "backend says no" in text
    assert any(fix in hint for hint in report["hints"]), report["hints"]
    assert "NOT OK" in text


def test_doctor_fails_when_nothing_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, text = doctor(monkeypatch, "http://127.0.0.1:1/v1/traces")
    assert code == 1
    assert "Connection refused" in report["route"]["local"]["detail"], report["route"]["local"]["detail"]
    assert any(h.startswith("nothing answers at http://127.0.0.1:1/v1/traces") for h in report["hints"])
    assert "OK: spans reach" not in text


def test_status_names_each_exporters_endpoint_last_error_and_counts(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    sink = start_receiver(status=422)
    # Spilling off: this test is about what status() reports of a refusing exporter, not about the spill.
    bridge = make_bridge(exporter=["otlp", "memory"], otlp_endpoint=sink.url, schedule_delay_ms=10, spill_max_bytes=0)
    with bridge.session(sample=0, session=0):
        pass
    assert bridge.force_flush(10)
    status = bridge.status()
    # The reason phrase is whatever this Python's http.server sends (3.13 renamed 422's).
    refused = f"POST {sink.url} answered 422 {HTTPStatus(422).phrase}: 'backend says no' (not retried)"
    otlp = status["exporters"]["otlp"]
    assert (otlp["endpoint"], otlp["last_error"]) == (sink.url, refused)
    assert status["exporters"] == {
        "otlp": {
            "role": "primary",
            "endpoint": sink.url,
            "path": None,
            "last_error": refused,
            "exported": 0,
            "failed": 1,
            "spilled": 0,
            "discarded": 0,
        },
        "memory": {
            "role": "copy",
            "endpoint": None,
            "path": None,
            "last_error": None,
            "exported": 1,
            "failed": 0,
            "spilled": 0,
            "discarded": 0,
        },
    }
    sink.status = 200
    with bridge.session(sample=0, session=1):
        pass
    assert bridge.force_flush(10)
    assert bridge.status()["exporters"]["otlp"] == {
        "role": "primary",
        "endpoint": sink.url,
        "path": None,
        "last_error": None,
        "exported": 1,
        "failed": 1,
        "spilled": 0,
        "discarded": 0,
    }
