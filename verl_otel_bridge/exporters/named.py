"""The exporters the config names (everything but ``auto``/``rl_insight``), built from a config."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.exporters.console import console_exporter
from verl_otel_bridge.exporters.discard import DiscardSpanExporter
from verl_otel_bridge.exporters.jsonl import JsonlSpanExporter
from verl_otel_bridge.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge.exporters.vocabulary import GenericVocabularySpanExporter

#: Exporters that do no I/O, so spans can be exported inline without a queue.
INLINE = frozenset({"memory", "none"})


def named_exporter(name: str, config: BridgeConfig) -> SpanExporter:
    """``memory``, ``jsonl``, ``console``, ``otlp`` or ``none``, set up from ``config``.

    ``otlp`` sends the generic vocabulary (OpenInference and GenAI keys, see
    :mod:`verl_otel_bridge.exporters.vocabulary`); ``memory``, ``jsonl`` and
    ``console`` keep the spans as recorded (the bridge's record format, which
    ``show`` and ``replay`` read), so a capture replays losslessly anywhere.

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
        return GenericVocabularySpanExporter(otlp_exporter(config), config.project)
    raise ValueError(f"verl_otel_bridge: {name!r} is not an exporter name (memory, jsonl, console, otlp, none)")


def otlp_exporter(config: BridgeConfig) -> SpanExporter:
    """The package's OTLP/HTTP exporter, configured as OpenTelemetry's would be (``OTEL_EXPORTER_OTLP_*``).

    ``otlp_endpoint``, when set, is the traces URL as it is.

    Raises:
        ValueError: a bad ``OTEL_EXPORTER_OTLP_*`` value, or urllib3 (the ``otlp`` extra) is missing.
    """
    from verl_otel_bridge.otlp.exporter import OtlpSpanExporter
    from verl_otel_bridge.otlp.sender import import_urllib3

    import_urllib3("exporter 'otlp'")
    return OtlpSpanExporter.from_environment(endpoint=config.otlp_endpoint)
