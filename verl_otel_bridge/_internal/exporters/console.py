"""Prints one JSON line per span to a stream (stdout by default)."""

from __future__ import annotations

import sys
from typing import TextIO

from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from verl_otel_bridge._internal.records import RecordLines


def console_exporter(out: TextIO | None = None) -> ConsoleSpanExporter:
    """OpenTelemetry's console exporter, writing the bridge's compact JSON records."""
    return ConsoleSpanExporter(
        out=out if out is not None else sys.stdout,
        formatter=RecordLines().line,
    )
