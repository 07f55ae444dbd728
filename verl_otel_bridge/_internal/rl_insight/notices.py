"""How the RL-Insight exporter says that RL-Insight is unusable: once per reason, then as a reminder."""

from __future__ import annotations

import logging

from verl_otel_bridge._internal.logs import OnceLogger, Reminder
from verl_otel_bridge._internal.rl_insight import compat
from verl_otel_bridge._internal.rl_insight.compat import Probe


class UnusableNotice:
    """Logs each reason RL-Insight is unusable once, and a reminder every ``reminder_interval_s`` while it lasts.

    A reason that cannot change while the process runs (``Probe.static``) is said once
    per process, not once per exporter (see :func:`compat.claim_reason`). Asked for
    explicitly, the lines are WARNINGs; under ``auto``, INFOs.
    """

    def __init__(
        self, logger: logging.Logger, *, explicit: bool, fallback_name: str, reminder_interval_s: float
    ) -> None:
        self._logger = logger
        self._level = logging.WARNING if explicit else logging.INFO
        self._fallback_name = fallback_name
        self._once = OnceLogger(logger)
        self._noted: set[str] = set()  # static reasons this exporter has already noted
        self._reminder = Reminder(logger, reminder_interval_s)

    def note(self, probe: Probe, fallback_spans: int) -> None:
        """Say (or remind) why ``probe`` is unusable; ``fallback_spans`` went to the fallback so far."""
        first_level: int | None = self._level
        if probe.static:
            key = (probe.reason, self._level, self._fallback_name)
            claimed = compat.claim_reason(self._noted, probe.reason, key)
            first_level = None if claimed is None else self._level if claimed else logging.DEBUG
        first = first_level is not None and self._once.log(
            probe.reason,
            first_level,
            "RL-Insight is not usable (%s): %s; spans go to the %s exporter instead",
            probe.reason,
            probe.detail,
            self._fallback_name,
        )
        if self._reminder.due() and not first:
            self._logger.log(
                self._level,
                "RL-Insight is still not usable (%s): %s; %d spans sent to the %s exporter so far",
                probe.reason,
                probe.detail,
                fallback_spans,
                self._fallback_name,
            )
