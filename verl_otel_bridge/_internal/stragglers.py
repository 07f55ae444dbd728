"""The straggler rule, said once: ``report`` (text and HTML), ``watch`` and the bridge's own watchdog use it.

A session is a straggler when it took longer than ``factor`` times the median
duration of its step's finished sessions *and* longer than ``min_s`` seconds. The
ratio alone calls a 2 ms session a straggler of a step whose median is 0.1 ms; the
floor keeps the word for sessions long enough to hold a step up.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The ratio's default (``straggler_factor``'s, the watchdog's setting).
DEFAULT_FACTOR = 3.0
#: The floor: a session shorter than this is never a straggler, whatever the ratio.
DEFAULT_MIN_S = 1.0


@dataclass(frozen=True)
class StragglerRule:
    """``factor`` times the step's median, and at least ``min_s`` seconds; ``factor`` 0 turns the rule off."""

    factor: float = DEFAULT_FACTOR
    min_s: float = DEFAULT_MIN_S

    def limit_s(self, median_s: float | None) -> float | None:
        """Seconds past which a session of a step with this median is a straggler (None: off, or no median)."""
        if not self.factor or median_s is None:
            return None
        return max(self.factor * median_s, self.min_s)

    def is_straggler(self, seconds: float, median_s: float | None) -> bool:
        """Whether a session that took ``seconds`` is a straggler of a step with this median."""
        limit = self.limit_s(median_s)
        return limit is not None and seconds > limit

    def describe(self) -> str:
        """The rule in words, for legends and help texts."""
        return f"longer than {self.factor:g} x its step's median and longer than {self.min_s:g} s"
