"""A session's trajectories as its span records them (``monitor.trajectories``), read back: their reward and
their turns, counted as verl counts them. The report, ``watch`` and the console exporter read them alike."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from verl_otel_bridge._internal.protocol import NUM_TURNS, REWARD_SCORE, TRAJECTORIES
from verl_otel_bridge._internal.records import parse_json


def trajectories(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The objects of the session's ``monitor.trajectories`` JSON list (none when it is anything else)."""
    value = attributes.get(TRAJECTORIES)
    if not isinstance(value, str):
        return []
    try:
        found = parse_json(value)
    except ValueError:
        return []
    return [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []


def reward(found: list[dict[str, Any]]) -> float | None:
    """The mean ``reward_score`` of the trajectories that have a finite one."""
    scores = [score for t in found if (score := _number(t.get(REWARD_SCORE))) is not None]
    return sum(scores) / len(scores) if scores else None


def verl_turns(attributes: Mapping[str, Any], found: list[dict[str, Any]]) -> int | None:
    """Turns as verl counts them: the session's ``num_turns`` (the verl plugin sets verl's), else the sum of
    its trajectories' ``num_turns`` when every one has it; None when the session says nothing."""
    own = _count(attributes.get(NUM_TURNS))
    if own is not None:
        return own
    turns = [_count(t.get(NUM_TURNS)) for t in found]
    if not turns or None in turns:
        return None
    return sum(n for n in turns if n is not None)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
