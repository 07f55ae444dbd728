"""``python -m verl_otel_bridge.cli``: the same as the ``verl-otel-bridge`` command."""

from verl_otel_bridge.cli.app import main

main()
