"""Small things a new user trips on: a typo in a status or a setting's value, a closed pipe, empty attributes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.tree import render_tree

WAIT_S = 120

# -- "did you mean" for values, as for keys -------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "meant"),
    [
        ({"exporter": "Console"}, "console"),
        ({"exporter": ["auto", "jsnol"]}, "jsonl"),
        ({"fallback": "consol"}, "console"),
        ({"rl_insight_transport": "HUB"}, "hub"),
    ],
    ids=["exporter", "exporter list", "fallback", "rl_insight_transport"],
)
def test_a_value_outside_a_keys_choices_gets_did_you_mean(settings: dict[str, object], meant: str) -> None:
    with pytest.raises(ValueError, match=rf"is not one of: .*Did you mean '{meant}'\?"):
        BridgeConfig.resolve(environ={}, **settings)


def test_did_you_mean_from_the_environment_and_only_when_something_is_close() -> None:
    with pytest.raises(ValueError, match=r"Did you mean 'console'\?.*VERL_OTEL_BRIDGE_EXPORTER"):
        BridgeConfig.resolve(environ={"VERL_OTEL_BRIDGE_EXPORTER": "Console"})
    with pytest.raises(ValueError) as raised:
        BridgeConfig.resolve(environ={}, exporter="kafka")
    assert "Did you mean" not in str(raised.value)
