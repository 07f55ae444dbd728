"""RL-Insight: the ``opentelemetry_traces_exporter`` entry point's class lives in :mod:`.exporter`."""
