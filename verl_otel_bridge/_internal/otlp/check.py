"""Whether an OTLP/HTTP traces endpoint takes export requests, asked as the ``otlp`` exporter would send them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.otlp.sender import OtlpHttpSender, OtlpSendError

#: An ``ExportTraceServiceRequest`` holding one ``ResourceSpans`` without spans: nothing is stored.
#: MLflow answers a request without any ``resource_spans`` with 400 ("no spans found") even when its
#: header is right; this one it checks for the header and accepts. It does not look the experiment up.
EMPTY_EXPORT_REQUEST = b"\n\x00"


def check_otlp_endpoint(
    endpoint: str, config: BridgeConfig, environ: Mapping[str, str], timeout_s: float
) -> dict[str, Any]:
    """POST an empty export request to ``endpoint`` as the ``otlp`` exporter would (``otlp_*`` keys).

    Returns ``doctor``'s ``{"ok", "detail", "fix"}``: ``detail`` names the endpoint and quotes the server's
    answer (status and the start of its body) or why nothing answered; ``fix`` what to change, or None.
    """
    sender = OtlpHttpSender.of(endpoint, config, default_timeout_s=timeout_s, environ=environ)
    try:
        sender.send(EMPTY_EXPORT_REQUEST)
    except OtlpSendError as exc:
        return {"ok": False, "detail": f"OTLP/HTTP to {sender.endpoint}: {exc}", "fix": _otlp_fix(exc, sender.endpoint)}
    finally:
        sender.close()
    return {"ok": True, "detail": f"OTLP/HTTP to {sender.endpoint}: accepts OTLP export requests", "fix": None}


def _otlp_fix(error: OtlpSendError, endpoint: str) -> str:
    if "x-mlflow-experiment-id" in str(error):
        return (
            "MLflow needs the experiment to store traces in: "
            "export OTEL_EXPORTER_OTLP_HEADERS=x-mlflow-experiment-id=<experiment id>"
        )
    if error.status == 404:
        return f"nothing takes OTLP traces at {endpoint}: the traces URL usually ends in /v1/traces (otlp_endpoint)"
    if error.status in (401, 403):
        return "the endpoint wants credentials: put them in OTEL_EXPORTER_OTLP_HEADERS (e.g. authorization=...)"
    if error.status == 415:
        return "the endpoint does not take OTLP/HTTP protobuf: point otlp_endpoint at an OTLP/HTTP traces endpoint"
    if error.status is None:
        return (
            f"nothing answers at {endpoint}: start the backend, or fix otlp_endpoint / "
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
    return "the server refused the request: see its answer above"
