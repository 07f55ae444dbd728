"""One agent-loop session: its identity, its ``agent_session`` span, and how it finishes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from opentelemetry.trace import Span

from verl_otel_bridge._internal.agent_loop import TaskHandle, TurnHandle, mark_failed
from verl_otel_bridge._internal.attributes import set_clean_attributes, to_text
from verl_otel_bridge._internal.identity import SessionIdentity, using_identity
from verl_otel_bridge._internal.protocol import (
    FAILED_STATUSES,
    FINISHED,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION,
    INVOKE_AGENT,
    NUM_TRAJECTORIES,
    REWARD_SOURCE,
    RUNNER_NAME,
    SESSION_SOURCE,
    STATUS,
    TRACE_SOURCE,
    TRAJECTORIES,
    TRAJECTORY_FIELDS,
)
from verl_otel_bridge._internal.scopes import SpanBlock
from verl_otel_bridge._internal.spans import record_error

logger = logging.getLogger(__name__)


def session_start_attributes(identity: SessionIdentity) -> dict[str, Any]:
    """What an ``agent_session`` span carries from its start (besides the identity)."""
    attributes: dict[str, Any] = {TRACE_SOURCE: SESSION_SOURCE, GEN_AI_OPERATION: INVOKE_AGENT}
    if identity.session_id:
        attributes[GEN_AI_CONVERSATION_ID] = identity.session_id
    return attributes


class _Steps(Protocol):
    """What a session needs from the bridge that made it."""

    def task(self, name: str, /, **attributes: Any) -> AbstractContextManager[TaskHandle]: ...

    def turn(
        self, turn: int, /, *, type: str = "generate", **attributes: Any
    ) -> AbstractContextManager[TurnHandle]: ...

    def note_status(self, status: str) -> None: ...


class Session:
    """A running session, yielded by ``Bridge.session(...)``.

    Attributes:
        identity: the :class:`SessionIdentity` every span inside carries.
        span: the OpenTelemetry ``agent_session`` span.
    """

    def __init__(self, identity: SessionIdentity, span: Span, bridge: _Steps) -> None:
        self.identity = identity
        self.span = span
        self.status: str | None = None
        self.trajectories: Sequence[Any] = ()
        self._bridge = bridge

    def task(self, name: str, /, **attributes: Any) -> AbstractContextManager[TaskHandle]:
        """An ``agent_task`` span in this session: see :meth:`Bridge.task`."""
        return self._bridge.task(name, **attributes)

    def turn(self, turn: int, /, *, type: str = "generate", **attributes: Any) -> AbstractContextManager[TurnHandle]:
        """An ``agent_turn`` span in this session: see :meth:`Bridge.turn`."""
        return self._bridge.turn(turn, type=type, **attributes)

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
        and ``finished`` on the session span (``""`` for None). A status in
        :data:`~verl_otel_bridge._internal.protocol.FAILED_STATUSES` (``error``, ``failed``,
        ``cancelled``, ...) also sets the span status to ERROR, described as
        ``session finished with status '<status>'`` unless an exception already
        set it. Another status than the protocol's (``success``, the failed ones,
        ``unfinished``) is kept as given and warned about once per value. The span
        itself ends when the ``with`` block exits. Calling it twice keeps the first
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
        self.status = to_text(status)
        self._bridge.note_status(self.status)
        try:
            self.trajectories = tuple(trajectories or ())
        except TypeError:
            logger.warning("session finish(trajectories=%r): not a sequence; recorded as none", trajectories)
            self.trajectories = ()
        attributes: dict[str, Any] = {
            RUNNER_NAME: to_text(runner_name) if runner_name else "",
            STATUS: self.status,
            NUM_TRAJECTORIES: len(self.trajectories),
            REWARD_SOURCE: to_text(reward_source) if reward_source else "",
            FINISHED: bool(finished) if finished is not None else "",
        }
        if self.trajectories:
            attributes[TRAJECTORIES] = _trajectory_summaries(self.trajectories)
        set_clean_attributes(self.span, attributes)  # text, ints and bools: nothing to convert
        if self.status.lower() in FAILED_STATUSES:
            mark_failed(self.span, f"session finished with status {self.status!r}")


def _trajectory_summaries(trajectories: Sequence[Any]) -> str:
    summaries = []
    for trajectory in trajectories:
        summary = {}
        for name in TRAJECTORY_FIELDS:
            try:
                value = trajectory.get(name) if isinstance(trajectory, dict) else getattr(trajectory, name, None)
            except Exception:  # noqa: BLE001 - a property that raises: the field is left out, the caller never sees it
                value = None
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                summary[name] = value
            elif value is not None:
                summary[name] = to_text(value)
        summaries.append(summary)
    return json.dumps(summaries)


class SessionScope:
    """``Bridge.session(...)``'s context manager: the session starts on enter (``start()``), is current for
    the block, and finishes and ends on exit.

    If the block raises, the session span gets status ERROR, an exception event and
    ``status="error"`` (``"cancelled"`` for a cancelled task), and the exception
    propagates unchanged; without an explicit ``finish``, a normal exit finishes with
    ``status="success"``. A plain class rather than a generator: one per session.
    A forked child leaving the block of a session its parent entered neither
    finishes nor ends it: the parent does.
    """

    __slots__ = ("_block", "_identity_scope", "_session", "_start")

    def __init__(self, start: Callable[[], Session]) -> None:
        self._start = start

    def __enter__(self) -> Session:
        session = self._session = self._start()
        self._identity_scope = using_identity(session.identity)
        self._identity_scope.__enter__()
        self._block = SpanBlock(session.span)
        return session

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        session, span = self._session, self._session.span
        if self._block.inherited:  # a forked child leaving its parent's session: the parent finishes and ends it
            self._block.close()
            self._identity_scope.__exit__(None, None, None)
            return
        try:
            if span.is_recording() and not session.finished:  # not ended meanwhile by shutdown: that ending stands
                if exc is None:
                    session.finish(status="success")
                else:
                    record_error(span, exc)
                    session.finish(status="cancelled" if isinstance(exc, asyncio.CancelledError) else "error")
            elif exc is not None and span.is_recording():
                record_error(span, exc)
        finally:
            self._block.close()
            if span.is_recording():
                span.end()
            self._identity_scope.__exit__(None, None, None)
