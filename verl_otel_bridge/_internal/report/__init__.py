"""The report's implementation: see :mod:`verl_otel_bridge.report`."""
