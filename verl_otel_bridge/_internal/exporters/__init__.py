"""Span exporters, each one class with one job; the bridge composes them."""

from verl_otel_bridge._internal.exporters.console import console_exporter
from verl_otel_bridge._internal.exporters.counting import CountingSpanExporter
from verl_otel_bridge._internal.exporters.discard import DiscardSpanExporter
from verl_otel_bridge._internal.exporters.jsonl import JsonlSpanExporter
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.exporters.redacting import RedactingSpanExporter

__all__ = [
    "BoundedMemorySpanExporter",
    "CountingSpanExporter",
    "DiscardSpanExporter",
    "JsonlSpanExporter",
    "RedactingSpanExporter",
    "console_exporter",
]
