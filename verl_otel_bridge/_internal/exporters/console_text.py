"""Spans as lines for people: what the ``console`` exporter prints (``console_format: text``).

Sessions run concurrently, so their spans end interleaved; printed as they end they
would read as noise. A session's spans are therefore held until its ``agent_session``
span ends and printed together: one line per span, indented by its depth in the
session (children under parents, in start order), then one summary line. Progress
records of open sessions and spans outside any session are printed at once. Memory is
bounded: at most :data:`MAX_HELD_SESSIONS` sessions held (the oldest is printed early
when more open) and :data:`MAX_HELD_SPANS` spans each (the rest are counted).

Each line shows the span's name, its duration, ``ERROR`` and the message when it
failed, and the few attributes that matter for its kind: a session's identity, status
and reward; a task's name and reward; a turn's number, type, tokens and tool; a progress
record's age, turn and the span the session is in. Every value is escaped for a
terminal (:func:`~verl_otel_bridge._internal.tree.printable`); colours only for a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from verl_otel_bridge._internal.protocol import (
    COMPLETION_TOKENS,
    ERROR_TYPE,
    FINISH_REASON,
    GLOBAL_STEPS,
    PROGRESS_ELAPSED_S,
    PROGRESS_IDLE_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROMPT_TOKENS,
    REWARD,
    SAMPLE,
    SESSION,
    SESSION_SPAN_NAME,
    STATE_LANE_ID,
    STATUS,
    TASK_NAME,
    TASK_SPAN_NAME,
    TOOLS,
    TURN,
    TURN_SPAN_NAME,
    TURN_TYPE,
    UID,
)
from verl_otel_bridge._internal.trajectories import reward as trajectory_reward
from verl_otel_bridge._internal.trajectories import trajectories, verl_turns
from verl_otel_bridge._internal.tree import depth_first, display, printable

#: Sessions whose spans are held until the session ends; past this, the oldest is printed as it stands.
MAX_HELD_SESSIONS = 1000
#: Spans held per session; later ones are counted in its summary line.
MAX_HELD_SPANS = 200
_INDENT = "  "
#: ANSI styles (SGR) for a terminal.
_STYLES = {"bold": "1", "dim": "2", "red": "31", "yellow": "33", "cyan": "36"}


class _Held:
    __slots__ = ("cut", "spans")

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.cut = 0


class SpanText:
    """Turns batches of finished spans into lines to print (:meth:`lines`); :meth:`rest` gives the sessions
    still held (at shutdown). ``colour`` adds ANSI styles."""

    def __init__(self, *, colour: bool = False) -> None:
        self._colour = colour
        self._held: dict[tuple[str, str], _Held] = {}

    def lines(self, spans: Iterable[ReadableSpan]) -> list[str]:
        """What to print for these spans, each line ending in a newline."""
        out: list[str] = []
        for span in spans:
            attributes = span.attributes or {}
            lane = attributes.get(STATE_LANE_ID)
            if not isinstance(lane, str) or span.name == PROGRESS_SPAN_NAME:
                out.append(self._line(span, 0, attributes))
                continue
            key = (lane, display(attributes.get(GLOBAL_STEPS, "")))
            held = self._held.get(key)
            if held is None:
                if len(self._held) >= MAX_HELD_SESSIONS:
                    oldest = next(iter(self._held))
                    out.extend(self._session(oldest, self._held.pop(oldest), ended=False))
                held = self._held[key] = _Held()
            if len(held.spans) < MAX_HELD_SPANS or span.name == SESSION_SPAN_NAME:
                held.spans.append(span)
            else:
                held.cut += 1
            if span.name == SESSION_SPAN_NAME:
                del self._held[key]
                out.extend(self._session(key, held, ended=True))
        return out

    def rest(self) -> list[str]:
        """The sessions still held, printed as they stand (their session span never came)."""
        out: list[str] = []
        for key, held in list(self._held.items()):
            out.extend(self._session(key, held, ended=False))
        self._held.clear()
        return out

    # -- one session -------------------------------------------------------------------

    def _session(self, key: tuple[str, str], held: _Held, *, ended: bool) -> list[str]:
        spans = held.spans
        out: list[str] = []
        below = 0  # an ended session's spans whose parent is missing sit below its session line
        for span, depth in depth_first(
            spans,
            key=_span_id,
            parent=lambda s: s.parent.span_id if s.parent is not None else None,
            order=lambda s: (s.start_time or 0, s.name),
        ):
            if depth == 0:
                below = 0 if span.name == SESSION_SPAN_NAME or not ended else 1
            out.append(self._line(span, depth + below, span.attributes or {}))
        out.append(self._summary(spans, held.cut, ended=ended))
        return out

    def _summary(self, spans: Sequence[ReadableSpan], cut: int, *, ended: bool) -> str:
        session = next((s for s in spans if s.name == SESSION_SPAN_NAME), None)
        attributes: Mapping[str, Any] = (session.attributes if session is not None else None) or {}
        identity: Mapping[str, Any] = attributes or next((s.attributes for s in spans if s.attributes), {})
        turns = [s for s in spans if s.name == TURN_SPAN_NAME]
        generated = sum(_count((s.attributes or {}).get(COMPLETION_TOKENS)) for s in turns)
        errors = sum(1 for s in spans if s.status.status_code is StatusCode.ERROR)
        said = " ".join(_pairs(identity, (UID, SAMPLE, SESSION, GLOBAL_STEPS)))
        parts = []
        if session is not None:
            parts += [display(attributes.get(STATUS) or session.status.status_code.name.lower()), _duration(session)]
        elif not ended:
            parts.append("not ended yet")
        counted = verl_turns(attributes, trajectories(attributes))
        parts.append(f"{counted if counted is not None else len(turns)} turns")
        parts.append(f"{generated} tokens generated")
        reward = _reward(spans, attributes)
        if reward is not None:
            parts.append(f"reward {reward:g}")
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
        if cut:
            parts.append(f"{cut} more spans not shown")
        return self._style(printable(f"── session {said}: {', '.join(parts)}"), "red" if errors else "bold") + "\n"

    # -- one span ----------------------------------------------------------------------

    def _line(self, span: ReadableSpan, depth: int, attributes: Mapping[str, Any]) -> str:
        name = span.name
        head = [self._style(printable(name), "bold" if name == SESSION_SPAN_NAME else "")]
        detail: list[str] = []
        if name == SESSION_SPAN_NAME:
            detail += _pairs(attributes, (UID, SAMPLE, SESSION, GLOBAL_STEPS, STATUS))
        elif name == TASK_SPAN_NAME:
            detail += _pairs(attributes, (TASK_NAME, STATUS, REWARD))
        elif name == TURN_SPAN_NAME:
            head.append(printable(f"{display(attributes.get(TURN, '?'))} {display(attributes.get(TURN_TYPE, ''))}"))
            prompt, completion = attributes.get(PROMPT_TOKENS), attributes.get(COMPLETION_TOKENS)
            if prompt is not None or completion is not None:
                detail.append(f"tokens {_count(prompt)}+{_count(completion)}")
            detail += _pairs(attributes, (TOOLS, FINISH_REASON))
        elif name == PROGRESS_SPAN_NAME:
            detail += _pairs(attributes, (STATE_LANE_ID, UID))
            turn, last = display(attributes.get(PROGRESS_TURN, "-")), display(attributes.get(PROGRESS_LAST_SPAN, "?"))
            elapsed, idle = _seconds(attributes.get(PROGRESS_ELAPSED_S)), _seconds(attributes.get(PROGRESS_IDLE_S))
            detail.append(printable(f"open {elapsed}, turn {turn}, in {last} for {idle}"))
        text = " ".join(head) + "  " + self._style(_duration(span), "dim")
        if span.status.status_code is StatusCode.ERROR:
            kind = attributes.get(ERROR_TYPE)
            message = span.status.description or (display(kind) if kind else "")
            text += "  " + self._style(printable(f"ERROR {message}".rstrip()), "red")
        if detail:
            text += "  " + " ".join(detail)
        if name == PROGRESS_SPAN_NAME:
            text = self._style("...", "yellow") + " " + text
        return _INDENT * depth + text + "\n"

    def _style(self, text: str, style: str) -> str:
        if not self._colour or not style or not text:
            return text
        return f"\x1b[{_STYLES[style]}m{text}\x1b[0m"


def _span_id(span: ReadableSpan) -> int | None:
    context = span.context
    return context.span_id if context is not None else None


def _pairs(attributes: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """``key=value`` for the keys that have a value (empty ones left out)."""
    out = []
    for key in keys:
        value = attributes.get(key)
        if value is None or value == "":
            continue
        text = display(value) if not isinstance(value, float) else f"{value:g}"
        out.append(printable(f"{key}={text if len(text) <= 60 else text[:57] + '...'}"))
    return out


def _duration(span: ReadableSpan) -> str:
    if span.start_time is None or span.end_time is None:
        return "?"
    seconds = (span.end_time - span.start_time) / 1e9
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) and not isinstance(value, bool) else "? s"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _reward(spans: Sequence[ReadableSpan], attributes: Mapping[str, Any]) -> float | None:
    """The session's reward as the report takes it: its task's ``reward``, else its trajectories' mean."""
    for span in spans:
        if span.name == TASK_SPAN_NAME:
            reward = (span.attributes or {}).get(REWARD)
            if isinstance(reward, (int, float)) and not isinstance(reward, bool):
                return float(reward)
    return trajectory_reward(trajectories(attributes))
