"""The exporters the config names (everything but ``auto``/``rl_insight``), built from a config."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.exporters.console import console_exporter
from verl_otel_bridge.exporters.discard import DiscardSpanExporter
from verl_otel_bridge.exporters.jsonl import JsonlSpanExporter
from verl_otel_bridge.exporters.memory import BoundedMemorySpanExporter

#: Exporters that do no I/O, so spans can be exported inline without a queue.
INLINE = frozenset({"memory", "none"})


def named_exporter(name: str, config: BridgeConfig) -> SpanExporter:
    """``memory``, ``jsonl``, ``console``, ``otlp`` or ``none``, set up from ``config``.

    Raises:
        ValueError: an unknown name, or ``otlp`` without its optional dependency.
    """
    if name == "memory":
        return BoundedMemorySpanExporter(config.memory_max_spans)
    if name == "jsonl":
        return JsonlSpanExporter(config.jsonl_path)
    if name == "console":
        return console_exporter()
    if name == "none":
        return DiscardSpanExporter()
    if name == "otlp":
        return otlp_exporter(config)
    raise ValueError(f"verl_otel_bridge: {name!r} is not an exporter name (memory, jsonl, console, otlp, none)")


def otlp_exporter(config: BridgeConfig) -> SpanExporter:
    """OpenTelemetry's OTLP/HTTP exporter; ``OTEL_EXPORTER_OTLP_*`` variables configure it."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ValueError(
            "verl_otel_bridge: exporter 'otlp' needs opentelemetry-exporter-otlp-proto-http; "
            "install it with: pip install 'verl-otel-bridge[otlp]'"
        ) from None
    return OTLPSpanExporter(endpoint=config.otlp_endpoint) if config.otlp_endpoint else OTLPSpanExporter()
