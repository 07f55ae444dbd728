"""The implementation: no stable API here; import from :mod:`verl_otel_bridge` and its documented modules.

The public surface is the top-level package, :mod:`verl_otel_bridge.verl`,
:mod:`verl_otel_bridge.propagation`, :mod:`verl_otel_bridge.testing`, the pytest
plugin, :mod:`verl_otel_bridge.report`, the CLI and the entry points.
"""
