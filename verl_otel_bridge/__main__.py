"""``python -m verl_otel_bridge``: the ``verl-otel-bridge`` command."""

from verl_otel_bridge.cli import main

main()
