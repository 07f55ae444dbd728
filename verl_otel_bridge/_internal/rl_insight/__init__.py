"""Everything that touches the ``rl_insight`` package: the version probe, the exporter, its transports.

Nothing outside this subpackage imports ``rl_insight``; the core loads these modules
only when a bridge wants RL-Insight (see :mod:`verl_otel_bridge._internal.pipeline.chain`).
"""
