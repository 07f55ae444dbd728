"""The ``verl-otel-bridge`` command: ``doctor``, ``demo``, ``show``, ``report``, ``watch``, ``replay``."""

from verl_otel_bridge.cli.app import main

__all__ = ["main"]
