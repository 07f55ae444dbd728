"""Values read from a capture, made safe to compute with: a line may hold any JSON value in any field."""

from __future__ import annotations

import math
from typing import Any

from verl_otel_bridge._internal.tree import display

#: Times and counts past a signed 64-bit integer are not ones the bridge wrote.
_MAX_NS = 1 << 63


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past the float range
        return None
    return number if math.isfinite(number) else None


def time_ns(value: Any) -> int:
    """A time (or a count) from a record: a non-negative 64-bit integer, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_NS else 0


def step_key(value: Any) -> Any:
    """A ``global_steps`` value usable as a key: an integer, a finite float or a string (anything else as JSON text)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return display(value)


def step_label(step: Any) -> str:
    """How a step is shown: its value, ``(no global_steps)`` for the sessions that have none."""
    return "(no global_steps)" if step == "" else str(step)


def span_id(value: Any) -> str | None:
    """A span id (or parent id) from a record: a string, else None."""
    return value if isinstance(value, str) else None
