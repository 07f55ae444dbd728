"""The ``rl_insight`` entry point of ``opentelemetry_traces_exporter`` (``OTEL_TRACES_EXPORTER=rl_insight``)."""

from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter

__all__ = ["RLInsightSpanExporter"]
