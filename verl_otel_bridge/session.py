"""One agent-loop session: its identity, its ``agent_session`` span, and how it finishes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import Span

from verl_otel_bridge.identity import SessionIdentity

logger = logging.getLogger("verl_otel_bridge.session")

#: Marks spans for RL-Insight's dashboard: ``session`` for sessions.
TRACE_SOURCE_ATTRIBUTE = "monitor.trace_source"
SESSION_SPAN_NAME = "agent_session"


class Session:
    """A running session, yielded by ``Bridge.session(...)``.

    Attributes:
        identity: the :class:`SessionIdentity` every span inside carries.
        span: the OpenTelemetry ``agent_session`` span.
    """

    def __init__(self, identity: SessionIdentity, span: Span) -> None:
        self.identity = identity
        self.span = span
        self.status: str | None = None
        self.trajectories: Sequence[Any] = ()

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` ran (explicitly or at the end of the block)."""
        return self.status is not None

    def finish(
        self,
        *,
        status: str,
        trajectories: Sequence[Any] | None = None,
        runner_name: str | None = None,
        reward_source: str | None = None,
        finished: bool | None = None,
    ) -> None:
        """Record how the session ended, as RL-Insight's ``agent_loop_session(...).finish`` does.

        Sets ``status``, ``num_trajectories``, ``runner_name``, ``reward_source``
        and ``finished`` on the session span (``""`` for None). The span itself
        ends when the ``with`` block exits. Calling it twice keeps the first
        outcome and logs a warning.
        """
        if self.status is not None:
            logger.warning(
                "session %s finished twice (first %r, now %r); keeping the first",
                self.identity.state_lane_id,
                self.status,
                status,
            )
            return
        self.status = str(status)
        self.trajectories = tuple(trajectories or ())
        self.span.set_attributes(
            {
                "runner_name": runner_name or "",
                "status": self.status,
                "num_trajectories": len(self.trajectories),
                "reward_source": reward_source or "",
                "finished": finished if finished is not None else "",
            }
        )
