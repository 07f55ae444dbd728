"""A conversation stored once, rebuilt whole: the generate turns of a trajectory as deltas, and back.

The verl plugin records a trajectory's text once (docs/protocol.md): its first
generate turn carries the whole prompt (``input``), each later one only the text
appended to the previous generate turn's prompt and response (``input.appended``)
and which turn that was (``input.after_turn``); every generate turn carries its
response (``content``). The session span carries no text of its own.

:class:`Conversations` turns that back into what a reader or a backend that shows
one LLM call at a time wants, span by span in the order they were written: each
generate turn with its whole ``input`` (``input`` of the turn it continues, plus that
turn's ``content``, plus its own appended text; the delta keys removed), and the
session with ``input`` (its first generate turn's whole prompt) and ``output`` (its
last generate turn's response) when it has none of its own. Rebuilt text is cut at
``max_length`` characters as the recorder cuts any attribute.

What it keeps is bounded: per trajectory (trace id and ``state_lane_id``) the text of
its generate turns (each piece at most ``max_length`` characters), for the
trajectories seen most recently, at most ``max_chars`` characters in all; a turn
whose previous turn was forgotten (or never seen) keeps its delta.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.attributes import attributes_dict, bounded_text
from verl_otel_bridge._internal.protocol import (
    CONTENT,
    GENERATE_TURN,
    INPUT,
    INPUT_AFTER_TURN,
    INPUT_APPENDED,
    OUTPUT,
    REDACTED,
    SESSION_SPAN_NAME,
    STATE_LANE_ID,
    TURN,
    TURN_SPAN_NAME,
    TURN_TYPE,
)
from verl_otel_bridge._internal.records import replace_span

#: The recorder's default ``max_attribute_length`` (config.py): what readers cut rebuilt text at.
DEFAULT_MAX_LENGTH = 32_768
#: Characters of conversation text kept at most, over all trajectories.
DEFAULT_MAX_CHARS = 16 * 1024 * 1024
_DELTA_KEYS = (INPUT_APPENDED, INPUT_AFTER_TURN)
_REBUILT = (TURN_SPAN_NAME, SESSION_SPAN_NAME)


class _Turn:
    __slots__ = ("after", "content", "text")

    def __init__(self, after: int | None, text: str, content: str) -> None:
        self.after = after  # the turn this one continues, or None: ``text`` is its whole prompt
        self.text = text
        self.content = content


class _Trajectory:
    __slots__ = ("chars", "first", "last", "turns")

    def __init__(self) -> None:
        self.turns: dict[int, _Turn] = {}
        self.first: int | None = None
        self.last: int | None = None
        self.chars = 0


class Conversations:
    """Rebuilds whole conversations from turns recorded as deltas (see the module docstring)."""

    def __init__(self, max_length: int = DEFAULT_MAX_LENGTH, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_length = max_length
        self.max_chars = max_chars
        self._trajectories: OrderedDict[Hashable, _Trajectory] = OrderedDict()
        self._chars = 0

    def spans(self, spans: Sequence[ReadableSpan]) -> Sequence[ReadableSpan]:
        """``spans`` with their conversation rebuilt (a copy of each span that changes; the others as they are)."""
        out: list[ReadableSpan] | None = None
        for index, span in enumerate(spans):
            attributes = span.attributes
            if span.name not in _REBUILT or not attributes or STATE_LANE_ID not in attributes:
                continue
            context = span.get_span_context()
            changed = self.rebuilt(context.trace_id if context else None, span.name, attributes_dict(attributes))
            if changed is not None:
                out = list(spans) if out is None else out
                out[index] = replace_span(span, attributes=changed)
        return spans if out is None else out

    def rebuilt(self, trace_id: Hashable, name: str, attributes: Mapping[str, Any]) -> dict[str, Any] | None:
        """The attributes a span named ``name`` of trace ``trace_id`` should have instead, or None: unchanged."""
        lane = attributes.get(STATE_LANE_ID)
        if not isinstance(lane, str) or not isinstance(trace_id, (str, int, type(None))):
            return None  # (a record written by someone else may hold anything)
        if name == TURN_SPAN_NAME:
            if attributes.get(TURN_TYPE, GENERATE_TURN) != GENERATE_TURN:
                return None
            return self._turn((trace_id, lane), attributes)
        if name == SESSION_SPAN_NAME and (INPUT not in attributes or OUTPUT not in attributes):
            return self._session((trace_id, lane), attributes)
        return None

    def _turn(self, key: Hashable, attributes: Mapping[str, Any]) -> dict[str, Any] | None:
        whole, appended = attributes.get(INPUT), attributes.get(INPUT_APPENDED)
        content = attributes.get(CONTENT)
        if not isinstance(whole, str) and not isinstance(appended, str) and not isinstance(content, str):
            return None
        trajectory = self._trajectories.get(key)
        if trajectory is None:
            trajectory = self._trajectories[key] = _Trajectory()
        else:
            self._trajectories.move_to_end(key)
        number = attributes.get(TURN)
        after = None if isinstance(whole, str) else attributes.get(INPUT_AFTER_TURN)
        if not isinstance(number, int) or not isinstance(after, (int, type(None))):
            return None
        piece = whole if isinstance(whole, str) else appended if isinstance(appended, str) else ""
        turn = _Turn(after, piece[: self.max_length], content[: self.max_length] if isinstance(content, str) else "")
        self._keep(trajectory, number, turn)
        if not isinstance(appended, str) or isinstance(whole, str):
            return None
        prompt = self._prompt(trajectory, number)
        if prompt is None:
            return None
        out = {k: v for k, v in attributes.items() if k not in _DELTA_KEYS}
        out[INPUT] = prompt
        return out

    def _keep(self, trajectory: _Trajectory, number: int, turn: _Turn) -> None:
        old = trajectory.turns.pop(number, None)
        if old is not None:
            self._count(trajectory, -len(old.text) - len(old.content))
        trajectory.turns[number] = turn
        self._count(trajectory, len(turn.text) + len(turn.content))
        if trajectory.first is None or number < trajectory.first:
            trajectory.first = number
        if trajectory.last is None or number > trajectory.last:
            trajectory.last = number
        while self._chars > self.max_chars and len(self._trajectories) > 1:
            _, dropped = self._trajectories.popitem(last=False)
            self._chars -= dropped.chars

    def _count(self, trajectory: _Trajectory, chars: int) -> None:
        trajectory.chars += chars
        self._chars += chars

    def _prompt(self, trajectory: _Trajectory, number: int) -> str | None:
        """Turn ``number``'s whole prompt, cut at ``max_length``; None when a turn it continues is missing."""
        pieces: list[str] = []
        seen: set[int] = set()
        while True:
            turn = trajectory.turns.get(number)
            if turn is None or number in seen:
                return None
            seen.add(number)
            pieces.append(turn.text)
            if turn.after is None:
                break
            previous = trajectory.turns.get(turn.after)
            if previous is None:
                return None
            pieces.append(previous.content)
            number = turn.after
        if REDACTED in pieces:
            return REDACTED
        return bounded_text("".join(reversed(pieces)), self.max_length)

    def _session(self, key: Hashable, attributes: Mapping[str, Any]) -> dict[str, Any] | None:
        trajectory = self._trajectories.get(key)
        if trajectory is None:
            return None
        self._trajectories.move_to_end(key, last=False)  # ended: the first to forget
        out = dict(attributes)
        if INPUT not in out and trajectory.first is not None:
            first = self._prompt(trajectory, trajectory.first)
            if first:
                out[INPUT] = first
        last = trajectory.turns.get(trajectory.last) if trajectory.last is not None else None
        if OUTPUT not in out and last is not None and last.content:
            out[OUTPUT] = last.content
        return out if len(out) != len(attributes) else None
