"""The verl integration's implementation: see :mod:`verl_otel_bridge.verl`."""
