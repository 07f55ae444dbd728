"""The agent-loop span vocabulary: tasks and turns, as RL-Insight's dashboard reads them.

RL-Insight's Agent Loop Trajectory dashboard finds spans by attributes, not by
name: a turn is any span with the session identity and an integer ``turn``; a
task is any span with ``monitor.trace_source="task"``. Each span made here also
carries the OpenTelemetry GenAI attributes (``gen_ai.*``) so the same trace
reads well in other backends. ``docs/protocol.md`` lists every attribute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from opentelemetry.trace import Span, Status, StatusCode

from verl_otel_bridge._internal.attributes import AttributeValue, set_clean_attributes, to_json, to_text
from verl_otel_bridge._internal.identity import current_identity
from verl_otel_bridge._internal.protocol import (
    ACCURACY,
    COMPLETION_TOKENS,
    CONTENT,
    ERROR,
    FAILED_STATUSES,
    FINISH_REASON,
    FINISHED,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION,
    GEN_AI_TWINS,
    INVOKE_AGENT,
    PROMPT_TOKENS,
    REASONING,
    REWARD,
    REWARD_POSTED,
    STATUS,
    TASK_NAME,
    TASK_SOURCE,
    TASK_SPAN_NAME,
    TOOL_ARGS,
    TOOLS,
    TRACE_SOURCE,
    TURN,
    TURN_OPERATIONS,
    TURN_SPAN_NAME,
    TURN_TYPE,
)

logger = logging.getLogger(__name__)


Clean = Callable[[Mapping[str, Any]], dict[str, Any]]


class SpanSource(Protocol):
    """What tasks and turns need from the bridge that makes them."""

    def span(self, name: str, /, **attributes: Any) -> Any:
        """A context manager around one span, yielding it."""

    def clean_attributes(self, attributes: Mapping[Any, Any]) -> dict[str, AttributeValue]:
        """``attributes`` converted to what OpenTelemetry accepts."""

    def note_bad_value(self, key: str, message: str, *args: object) -> None:
        """Count a value that had to be converted, and log ``message`` once per ``key``."""

    def note_status(self, status: str) -> None:
        """Warn (once per value) if ``status`` is not one the protocol names."""


class _Handle:
    def __init__(self, span: Span, clean: Clean) -> None:
        self.span = span
        self._clean = clean

    def _set(self, values: Mapping[str, Any]) -> None:
        set_clean_attributes(self.span, self._clean(values))  # which leaves None values out


class TaskHandle(_Handle):
    """Yielded by ``task(...)``: the span (``.span``), and a setter for the dashboard's task fields."""

    def __init__(self, span: Span, clean: Clean, note_status: Callable[[str], None]) -> None:
        super().__init__(span, clean)
        self._note_status = note_status

    def set_result(
        self,
        *,
        status: str | None = None,
        reward: float | None = None,
        accuracy: float | None = None,
        finished: bool | None = None,
        error: str | BaseException | None = None,
        reward_posted: bool | None = None,
    ) -> None:
        """Set the fields the dashboard's Task summary shows; None leaves a field unset.

        A ``status`` in :data:`~verl_otel_bridge._internal.protocol.FAILED_STATUSES` also sets the
        span status to ERROR, described by ``error`` (else by the status); one the protocol does
        not name is kept as given and warned about once per value.
        """
        values = {
            STATUS: status,
            REWARD: reward,
            ACCURACY: accuracy,
            FINISHED: finished,
            ERROR: _error_text(error) if error is not None else None,
            REWARD_POSTED: reward_posted,
        }
        self._set(values)
        if status is None:
            return
        text = to_text(status)
        self._note_status(text)
        if text.lower() in FAILED_STATUSES:
            described = _error_text(error) if error is not None else f"task finished with status {text!r}"
            mark_failed(self.span, described)


class TurnHandle(_Handle):
    """Yielded by ``turn(...)``: the span (``.span``), and :meth:`record` for what the turn produced."""

    def record(
        self,
        *,
        finish_reason: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        tools: str | Sequence[str] | None = None,
        tool_args: str | Mapping[str, Any] | None = None,
        content: str | None = None,
        reasoning: str | None = None,
    ) -> None:
        """Set the Turn details fields, each with its GenAI twin; None leaves a field unset.

        ``tools`` is a name or a list of names (joined with ``,``); ``tool_args`` a
        JSON string or a mapping (serialised to JSON).
        """
        tool_names = (
            None
            if tools is None
            else tools
            if isinstance(tools, str)
            else ",".join(map(to_text, tools))
            if isinstance(tools, Iterable)
            else to_text(tools)
        )
        if tool_args is not None and not isinstance(tool_args, str):
            try:
                tool_args = to_json(tool_args)
            except Exception:  # noqa: BLE001 - e.g. a cycle; the caller must not see it
                tool_args = to_text(tool_args)
        values: dict[str, Any] = {
            FINISH_REASON: finish_reason,
            PROMPT_TOKENS: prompt_tokens,
            COMPLETION_TOKENS: completion_tokens,
            TOOLS: tool_names,
            TOOL_ARGS: tool_args,
            CONTENT: content,
            REASONING: reasoning,
        }
        clean = self._clean(values)
        # The twins are copies of values converted once.
        for key, twin in GEN_AI_TWINS.items():
            if key in clean:
                clean[twin] = (clean[key],) if key == FINISH_REASON else clean[key]
        set_clean_attributes(self.span, clean)


class _TaskScope:
    """An ``agent_task`` span as one small class (no generator): the span starts on enter."""

    __slots__ = ("_attributes", "_bridge", "_handle", "_name", "_scope")

    def __init__(self, bridge: SpanSource, name: str, attributes: Mapping[str, Any]) -> None:
        self._bridge = bridge
        self._name = name
        self._attributes = attributes

    def __enter__(self) -> TaskHandle:
        task_name = to_text(self._name)
        base = {
            TRACE_SOURCE: TASK_SOURCE,
            TASK_NAME: task_name,
            GEN_AI_OPERATION: INVOKE_AGENT,
            GEN_AI_AGENT_NAME: task_name,
            **_conversation(),
        }
        # The keys that make it a task for the dashboard are the bridge's; the caller's attributes cannot replace them.
        self._scope = self._bridge.span(
            TASK_SPAN_NAME, **{**base, **self._attributes, TRACE_SOURCE: TASK_SOURCE, TASK_NAME: task_name}
        )
        self._handle = TaskHandle(self._scope.__enter__(), self._bridge.clean_attributes, self._bridge.note_status)
        return self._handle

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Any:
        if exc is not None:
            self._handle.set_result(status="error", error=exc)
        return self._scope.__exit__(exc_type, exc, tb)


class _TurnScope:
    """An ``agent_turn`` span as one small class (no generator): the span starts on enter."""

    __slots__ = ("_attributes", "_bridge", "_scope", "_turn", "_type")

    def __init__(self, bridge: SpanSource, turn: Any, turn_type: str, attributes: Mapping[str, Any]) -> None:
        self._bridge = bridge
        self._turn = turn
        self._type = turn_type
        self._attributes = attributes

    def __enter__(self) -> TurnHandle:
        turn, turn_type = _turn_number(self._bridge, self._turn), self._type
        base = {
            TURN: turn,
            TURN_TYPE: turn_type,
            GEN_AI_OPERATION: TURN_OPERATIONS.get(turn_type, turn_type),
            **_conversation(),
        }
        # As for tasks: the integer turn and its type come from the arguments, never from the attributes.
        self._scope = self._bridge.span(
            TURN_SPAN_NAME, **{**base, **self._attributes, TURN: turn, TURN_TYPE: turn_type}
        )
        return TurnHandle(self._scope.__enter__(), self._bridge.clean_attributes)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Any:
        return self._scope.__exit__(exc_type, exc, tb)


def task_span(bridge: SpanSource, name: str, attributes: Mapping[str, Any]) -> AbstractContextManager[TaskHandle]:
    """An ``agent_task`` span; an exception sets ``status="error"`` and ``error``, then propagates."""
    return _TaskScope(bridge, name, attributes)


def turn_span(
    bridge: SpanSource, turn: Any, turn_type: str, attributes: Mapping[str, Any]
) -> AbstractContextManager[TurnHandle]:
    """An ``agent_turn`` span with an integer ``turn`` (the dashboard compares it as a number)."""
    return _TurnScope(bridge, turn, turn_type, attributes)


def _conversation() -> dict[str, str]:
    identity = current_identity()
    if identity is None or not identity.session_id:
        return {}
    return {GEN_AI_CONVERSATION_ID: identity.session_id}


def _turn_number(bridge: SpanSource, turn: Any) -> Any:
    try:
        return int(turn)
    except Exception:  # noqa: BLE001 - whatever int() raises, the caller must not see it
        bridge.note_bad_value("turn:not-int", "turn=%r is not an integer; the dashboard will not show this turn", turn)
        return to_text(turn)


def _error_text(error: str | BaseException) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {to_text(error)}"
    return to_text(error)


def mark_failed(span: Span, description: str) -> None:
    """Set ``span``'s status to ERROR with ``description``, unless it already is ERROR (e.g. from an exception)."""
    status = getattr(span, "status", None)
    if status is None or status.status_code is not StatusCode.ERROR:
        span.set_status(Status(StatusCode.ERROR, description))
