"""Stream JSONL captures (one or several files, e.g. one per worker) into per-step answers.

A session is one ``(global_steps, state_lane_id)`` pair, the key RL-Insight's
dashboard groups by, so spans of one session written by several processes meet
here in any order. Memory grows with the number of sessions (one small
accumulator each, a few hundred bytes), not with spans or attribute sizes:
span segments for the waterfall are kept only while a session can still be
among its step's slowest (:data:`MAX_SEGMENTS` at most per session).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.protocol import (
    COMPLETION_TOKENS,
    ERROR,
    FAILED_STATUSES,
    GENERATE_TURN,
    GLOBAL_STEPS,
    INPUT,
    OUTPUT,
    PROGRESS_ELAPSED_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROGRESS_TURNS,
    PROMPT_TOKENS,
    REWARD,
    REWARD_SCORE,
    SAMPLE,
    SERVER_ADDRESS,
    SESSION,
    SESSION_SPAN_NAME,
    STATE_LANE_ID,
    STATUS,
    TASK_SPAN_NAME,
    TRAJECTORIES,
    TURN,
    TURN_SPAN_NAME,
    TURN_TYPE,
    UID,
    UNFINISHED,
)
from verl_otel_bridge._internal.records import parse_json
from verl_otel_bridge._internal.report.phases import PhaseCollector, StepPhases, by_step
from verl_otel_bridge._internal.report.values import finite_number, step_key, time_ns
from verl_otel_bridge._internal.tree import display

#: Span segments kept per session for the waterfall; later ones are counted, not kept.
MAX_SEGMENTS = 200
#: Points per step kept for the reward-vs-duration plot (the slowest are always in).
MAX_SCATTER_POINTS = 500
#: Bad lines remembered (all are counted).
MAX_BAD_LINES = 20
#: Characters of a listed session's first input and last output kept.
MAX_TEXT = 4000
_NS = 1e9
#: A session slower than this many times its step's median is called a straggler
#: (the bridge's own watchdog default, ``straggler_factor``).
DEFAULT_STRAGGLER_FACTOR: float = BridgeConfig.straggler_factor

#: How a session ended, as far as the capture shows.
FINISHED, UNFINISHED_KIND, HUNG, PARTIAL = "finished", "unfinished", "hung", "partial"


@dataclass(frozen=True)
class Segment:
    """One span of a session on the waterfall: times in ns since the epoch, ``kind`` is the turn type or ``span``."""

    start_ns: int
    end_ns: int
    kind: str
    label: str


@dataclass(frozen=True)
class SessionSummary:
    """One session as the capture shows it.

    ``kind`` is ``finished`` (its session span was exported), ``unfinished`` (ended by
    the bridge at shutdown), ``hung`` (no session span, but progress records: it was
    still open when the capture ends) or ``partial`` (neither: only some of its spans).
    For hung sessions ``duration_s`` is the last progress record's elapsed time.
    """

    step: Any
    state_lane_id: str
    uid: str
    sample: str
    session: str
    kind: str
    status: str
    start_ns: int
    duration_s: float
    turns: int
    generate_s: float
    tool_s: float
    tokens: int
    reward: float | None
    server: str
    errors: int
    error: str
    progress_records: int
    last_span: str
    segments: tuple[Segment, ...] = ()
    segments_cut: int = 0
    #: The conversation's first input and last output as rebuilt from its turns (``input``, ``output`` of the
    #: session), each cut at :data:`MAX_TEXT` characters; kept for the sessions a step lists only.
    input: str = ""
    output: str = ""


@dataclass(frozen=True)
class ZeroAdvantageGroup:
    """Sessions of one ``uid`` in one step whose rewards are all equal: GRPO's advantage is 0 for all."""

    uid: str
    sessions: int
    reward: float


@dataclass
class StepReport:
    """Everything the report says about one ``global_steps`` value."""

    step: Any
    sessions: int = 0
    finished: int = 0
    p50_s: float | None = None
    p90_s: float | None = None
    max_s: float | None = None
    slowest: list[SessionSummary] = field(default_factory=list)
    #: The slowest sessions longer than ``straggler_factor`` x the median (``p50_s``).
    stragglers: list[SessionSummary] = field(default_factory=list)
    unfinished: list[SessionSummary] = field(default_factory=list)
    hung: list[SessionSummary] = field(default_factory=list)
    partial: int = 0
    error_spans: int = 0
    errored: list[SessionSummary] = field(default_factory=list)
    zero_advantage: list[ZeroAdvantageGroup] = field(default_factory=list)
    rewarded: int = 0
    reward_mean: float | None = None
    reward_vs_duration: float | None = None
    reward_vs_turns: float | None = None
    #: ``(duration_s, reward, turns, state_lane_id)`` of finished sessions with a reward (sampled).
    points: list[tuple[float, float, int, str]] = field(default_factory=list)
    #: The ``state_lane_id`` of each session among ``points`` that had an error span or ended in error.
    point_errors: set[str] = field(default_factory=set)
    #: The trainer's ``training_step`` of this step: its phases, metrics and sessions (see :mod:`.phases`).
    trainer: StepPhases | None = None


@dataclass
class Report:
    """A whole report: one :class:`StepReport` per step, in step order, and what was read."""

    steps: list[StepReport]
    files: list[str]
    spans: int
    outside_sessions: int
    bad_lines: int
    bad_examples: list[tuple[str, int, str]]
    #: Every ``global_steps`` value the captures hold (also those ``step`` left out), in step order.
    steps_present: list[Any] = field(default_factory=list)
    #: Files skipped, with why: no span record in them (empty, cut short, another format), not capture files,
    #: links (the first few; ``skipped_count`` counts them all).
    skipped: list[tuple[str, str]] = field(default_factory=list)
    skipped_count: int = 0
    #: Span records read (in sessions or not).
    records: int = 0


class _Session:
    __slots__ = (
        "end_ns",
        "error",
        "errors",
        "first_ns",
        "generate_ns",
        "input",
        "keep",
        "last_ns",
        "output",
        "progress",
        "progress_at",
        "progress_elapsed",
        "progress_last_span",
        "progress_turns",
        "sample",
        "segments",
        "segments_cut",
        "server",
        "session",
        "session_span",
        "start_ns",
        "status",
        "task_reward",
        "tokens",
        "tool_ns",
        "traj_reward",
        "turn",
        "turns",
        "uid",
    )

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.uid = sys.intern(display(attributes.get(UID, "")))  # one string per group, not per session
        self.sample = display(attributes.get(SAMPLE, ""))
        self.session = display(attributes.get(SESSION, ""))
        self.first_ns = self.last_ns = 0
        self.start_ns = self.end_ns = 0
        self.session_span = False
        self.status = ""
        self.turns = self.tokens = self.generate_ns = self.tool_ns = self.errors = self.progress = 0
        self.turn: Any = None
        self.error = self.server = self.progress_last_span = ""
        self.task_reward: float | None = None
        self.traj_reward: float | None = None
        self.progress_at = 0
        self.progress_elapsed = 0.0
        self.progress_turns = 0
        self.segments: list[Segment] | None = []
        self.segments_cut = 0
        self.keep = True
        self.input = self.output = ""

    @property
    def reward(self) -> float | None:
        return self.task_reward if self.task_reward is not None else self.traj_reward

    @property
    def kind(self) -> str:
        if self.session_span:
            return UNFINISHED_KIND if self.status == UNFINISHED else FINISHED
        return HUNG if self.progress else PARTIAL


class _Aggregator:
    """The streaming state: session accumulators and, per step, the slowest sessions so far."""

    def __init__(self, step: Any, top: int) -> None:
        self.step_filter = step
        self.top = top
        self.sessions: dict[tuple[Any, str], _Session] = {}
        self.slowest: dict[Any, list[tuple[int, int, tuple[Any, str]]]] = {}
        self.order = itertools.count()
        self.spans = self.outside = 0
        self.error_spans: dict[Any, int] = {}
        self.steps_seen: set[Any] = set()

    def add(self, record: dict[str, Any]) -> None:
        attributes = record.get("attributes") or {}
        lane = attributes.get(STATE_LANE_ID)
        if not isinstance(lane, str):
            self.outside += 1
            return
        step = step_key(attributes.get(GLOBAL_STEPS, ""))
        self.steps_seen.add(step)
        if self.step_filter is not None and not _same_step(step, self.step_filter):
            return
        self.spans += 1
        key = (step, lane)
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = _Session(attributes)
        start = time_ns(record.get("start_time_ns"))
        end = max(start, time_ns(record.get("end_time_ns")))  # a span that ends before it starts took no time
        if not session.first_ns or start < session.first_ns:
            session.first_ns = start
        if end > session.last_ns:
            session.last_ns = end
        status = record.get("status") or {}
        if isinstance(status, dict) and status.get("code") == "ERROR":
            session.errors += 1
            self.error_spans[step] = self.error_spans.get(step, 0) + 1
            if not session.error:
                session.error = display(status.get("description") or attributes.get(ERROR) or record.get("name"))
        server = attributes.get(SERVER_ADDRESS)
        if server:
            session.server = sys.intern(display(server))
        name = record.get("name")
        if name == SESSION_SPAN_NAME:
            self._closed(key, session, attributes, start, end)
        elif name == PROGRESS_SPAN_NAME:
            if end >= session.progress_at:
                session.progress_at = end
                session.progress_elapsed = finite_number(attributes.get(PROGRESS_ELAPSED_S)) or 0.0
                session.progress_turns = int(finite_number(attributes.get(PROGRESS_TURNS)) or 0)
                session.progress_last_span = sys.intern(display(attributes.get(PROGRESS_LAST_SPAN, "")))
                session.turn = attributes.get(PROGRESS_TURN, session.turn)
            session.progress += 1
        else:
            kind = "span"
            if name == TURN_SPAN_NAME:
                kind = display(attributes.get(TURN_TYPE, GENERATE_TURN))
                session.turns += 1
                if kind == GENERATE_TURN:
                    session.generate_ns += end - start
                elif kind == "tool":
                    session.tool_ns += end - start
                for key_ in (PROMPT_TOKENS, COMPLETION_TOKENS):
                    tokens = attributes.get(key_)
                    session.tokens += time_ns(tokens)
            elif name == TASK_SPAN_NAME:
                reward = finite_number(attributes.get(REWARD))
                if reward is not None:
                    session.task_reward = reward
                return  # a task spans its turns: the waterfall shows the turns
            if session.keep and session.segments is not None:
                if len(session.segments) < MAX_SEGMENTS:
                    label = f"turn {display(attributes.get(TURN))} ({kind})" if name == TURN_SPAN_NAME else str(name)
                    session.segments.append(Segment(start, end, kind, label))
                else:
                    session.segments_cut += 1

    def _closed(
        self, key: tuple[Any, str], session: _Session, attributes: dict[str, Any], start: int, end: int
    ) -> None:
        session.session_span = True
        session.start_ns, session.end_ns = start, end
        session.status = sys.intern(display(attributes.get(STATUS, "")))
        session.traj_reward = _trajectory_reward(attributes.get(TRAJECTORIES))
        session.input, session.output = _text(attributes.get(INPUT)), _text(attributes.get(OUTPUT))
        if session.status == UNFINISHED:
            return  # listed on its own, segments kept
        heap = self.slowest.setdefault(key[0], [])
        entry = (end - start, next(self.order), key)
        if len(heap) < self.top:
            heapq.heappush(heap, entry)
            return
        evicted = heapq.heapreplace(heap, entry)[2] if entry[0] > heap[0][0] else key
        dropped = self.sessions[evicted]
        dropped.keep, dropped.segments = False, None
        dropped.input = dropped.output = ""


def build_report(
    paths: Sequence[str | os.PathLike[str]],
    *,
    step: Any = None,
    top: int = 5,
    max_listed: int = 10,
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR,
) -> Report:
    """Read every capture ``paths`` name (files, run or step folders: :func:`find_captures`; streamed, line by
    line) and answer per step.

    ``step`` keeps one ``global_steps`` value only (and of a run folder opens only that
    step's folder); ``top`` is how many slowest sessions each step lists; ``max_listed``
    bounds the unfinished, hung and errored sessions listed per step (all are counted); a
    session is a straggler when it took longer than ``straggler_factor`` times its step's median.
    Files that hold no span record (empty, cut short, unrelated) are skipped and listed.
    """
    aggregator = _Aggregator(step, max(1, top))
    phases = PhaseCollector()
    found = find_captures(paths, step=step if isinstance(step, int) and not isinstance(step, bool) else None)
    reading = CaptureRecords(found.files)
    for record in reading:
        aggregator.add(record)
        phases.add(record)
    steps = _with_trainer(_steps(aggregator, max_listed, straggler_factor), phases.steps(step))
    present = sorted(aggregator.steps_seen, key=_step_order)
    empty = reading.empty
    return Report(
        steps,
        [os.fspath(p) for p in found.files],
        aggregator.spans,
        aggregator.outside,
        reading.bad_lines,
        reading.bad_examples,
        present,
        skipped=found.skipped + empty[: max(0, MAX_BAD_LINES - len(found.skipped))],
        skipped_count=found.skipped_count + len(empty),
        records=reading.records,
    )


def _steps(aggregator: _Aggregator, max_listed: int, straggler_factor: float) -> list[StepReport]:
    by_step: dict[Any, list[tuple[str, _Session]]] = {}
    for (step, lane), session in aggregator.sessions.items():
        by_step.setdefault(step, []).append((lane, session))
    reports = []
    for step in sorted(by_step, key=_step_order):
        members = by_step[step]
        report = StepReport(step=step, sessions=len(members), error_spans=aggregator.error_spans.get(step, 0))
        finished = [(lane, s) for lane, s in members if s.kind == FINISHED]
        report.finished = len(finished)
        durations = sorted((s.end_ns - s.start_ns) / _NS for _, s in finished)
        if durations:
            report.p50_s, report.p90_s, report.max_s = (
                _percentile(durations, 0.5),
                _percentile(durations, 0.9),
                durations[-1],
            )
        slow_keys = {key for _, _, key in aggregator.slowest.get(step, [])}
        slowest = [_summary(step, lane, s) for lane, s in finished if (step, lane) in slow_keys]
        report.slowest = sorted(slowest, key=lambda s: -s.duration_s)
        if report.p50_s is not None:
            limit = straggler_factor * report.p50_s
            report.stragglers = [s for s in report.slowest if s.duration_s > limit]
        for kind, target in ((UNFINISHED_KIND, report.unfinished), (HUNG, report.hung)):
            chosen = sorted((m for m in members if m[1].kind == kind), key=lambda m: -_summary_age(m[1]))
            target.extend(_summary(step, lane, s) for lane, s in chosen[:max_listed])
        report.partial = sum(1 for _, s in members if s.kind == PARTIAL)
        report.errored = [_summary(step, lane, s, segments=False) for lane, s in members if s.errors][:max_listed]
        report.zero_advantage = _zero_advantage(members)
        _rewards(report, step, finished, slow_keys)
        reports.append(report)
    return reports


def _with_trainer(steps: list[StepReport], trainer: list[StepPhases]) -> list[StepReport]:
    """Each step with its ``training_step`` (a step the trainer traced but no session reached is added)."""
    found = by_step(trainer)
    for report in steps:
        report.trainer = found.pop(report.step, None)
    steps.extend(StepReport(step=value, trainer=phases) for value, phases in found.items())
    return sorted(steps, key=lambda report: _step_order(report.step))


def _summary(step: Any, lane: str, s: _Session, *, segments: bool = True) -> SessionSummary:
    kind = s.kind
    hung = kind in (HUNG, PARTIAL)
    return SessionSummary(
        step=step,
        state_lane_id=lane,
        uid=s.uid,
        sample=s.sample,
        session=s.session,
        kind=kind,
        status=s.status,
        start_ns=s.first_ns if hung else s.start_ns,
        duration_s=_summary_age(s),
        turns=max(s.turns, s.progress_turns),
        generate_s=s.generate_ns / _NS,
        tool_s=s.tool_ns / _NS,
        tokens=s.tokens,
        reward=s.reward,
        server=s.server,
        errors=s.errors,
        error=s.error,
        progress_records=s.progress,
        last_span=s.progress_last_span,
        segments=tuple(sorted(s.segments or (), key=lambda g: g.start_ns)) if segments else (),
        segments_cut=s.segments_cut,
        input=s.input,
        output=s.output,
    )


def _text(value: Any) -> str:
    return display(value)[:MAX_TEXT] if value is not None else ""


def _summary_age(s: _Session) -> float:
    return s.progress_elapsed if s.kind == HUNG else _span_s(s)


def _span_s(s: _Session) -> float:
    if s.session_span:
        return (s.end_ns - s.start_ns) / _NS
    return (s.last_ns - s.first_ns) / _NS


def _zero_advantage(members: Iterable[tuple[str, _Session]]) -> list[ZeroAdvantageGroup]:
    groups: dict[str, list[float | None]] = {}
    for _, s in members:
        if s.uid and s.kind == FINISHED:
            groups.setdefault(s.uid, []).append(s.reward)
    found = []
    for uid, rewards in groups.items():
        known = [r for r in rewards if r is not None]
        if len(rewards) >= 2 and len(known) == len(rewards) and max(known) == min(known):
            found.append(ZeroAdvantageGroup(uid, len(rewards), known[0]))
    return sorted(found, key=lambda g: (-g.sessions, g.uid))


def _rewards(report: StepReport, step: Any, finished: list[tuple[str, _Session]], slow: set[Any]) -> None:
    rows = [((s.end_ns - s.start_ns) / _NS, s.reward, s.turns, lane) for lane, s in finished if s.reward is not None]
    report.rewarded = len(rows)
    if not rows:
        return
    rewards = [r for _, r, _, _ in rows if r is not None]
    report.reward_mean = sum(rewards) / len(rewards)
    report.reward_vs_duration = _pearson([d for d, *_ in rows], rewards)
    report.reward_vs_turns = _pearson([float(t) for _, _, t, _ in rows], rewards)
    stride = max(1, math.ceil(len(rows) / MAX_SCATTER_POINTS))
    report.points = [
        (d, r, t, lane)
        for i, (d, r, t, lane) in enumerate(rows)
        if r is not None and (i % stride == 0 or (step, lane) in slow)
    ]
    failed = {lane for lane, s in finished if s.errors or s.status.lower() in FAILED_STATUSES}
    report.point_errors = {lane for *_, lane in report.points if lane in failed}


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r, or None with fewer than 3 points or a constant series."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.sqrt(sxx * syy)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted data."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _trajectory_reward(value: Any) -> float | None:
    """The mean ``reward_score`` of a session's ``monitor.trajectories`` JSON, if any."""
    if not isinstance(value, str):
        return None
    try:
        trajectories = parse_json(value)
    except ValueError:
        return None
    scores = (
        [
            score
            for t in trajectories
            if isinstance(t, dict) and (score := finite_number(t.get(REWARD_SCORE))) is not None
        ]
        if isinstance(trajectories, list)
        else []
    )
    return sum(scores) / len(scores) if scores else None


def _same_step(value: Any, wanted: Any) -> bool:
    return bool(value == wanted or str(value) == str(wanted))


def _step_order(step: Any) -> tuple[int, float, str]:
    number = finite_number(step)
    if number is not None:
        return (0, number, "")
    return (1, 0.0, str(step))
