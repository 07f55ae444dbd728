"""Stream JSONL captures (one or several files, e.g. one per worker) into per-step answers.

A session is one ``(global_steps, state_lane_id)`` pair, the key RL-Insight's
dashboard groups by, so spans of one session written by several processes meet
here in any order. Memory grows with the number of sessions (one small
accumulator each, a few hundred bytes), not with spans or attribute sizes:
span segments for the waterfall are kept only while a session can still be
among its step's slowest (:data:`MAX_SEGMENTS` at most per session).

:class:`ReportBuilder` is the one aggregation: ``report`` (text and HTML) feeds it
whole captures, ``watch`` feeds it lines as they are written and asks for the
newest steps again and again (forgetting older ones), so a figure means the same
on every screen.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.protocol import (
    AGENT_NAME,
    COMPLETION_TOKENS,
    ERROR,
    ERROR_TYPE,
    FAILED_STATUSES,
    GENERATE_TURN,
    GLOBAL_STEPS,
    INPUT,
    OUTPUT,
    PROGRESS_ELAPSED_S,
    PROGRESS_IDLE_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROGRESS_TURNS,
    PROMPT_TOKENS,
    REWARD,
    RUNNER_NAME,
    SAMPLE,
    SERVER_ADDRESS,
    SESSION,
    SESSION_SPAN_NAME,
    STATE_LANE_ID,
    STATUS,
    TASK_SPAN_NAME,
    TOOLS,
    TURN,
    TURN_SPAN_NAME,
    TURN_TYPE,
    UID,
    UNFINISHED,
)
from verl_otel_bridge._internal.report.phases import PhaseCollector, StepPhases, by_step
from verl_otel_bridge._internal.report.values import finite_number, step_key, time_ns
from verl_otel_bridge._internal.stragglers import DEFAULT_MIN_S, StragglerRule
from verl_otel_bridge._internal.trajectories import reward as trajectory_reward
from verl_otel_bridge._internal.trajectories import trajectories, verl_turns
from verl_otel_bridge._internal.tree import display

#: Span segments kept per session for the waterfall; later ones are counted, not kept.
MAX_SEGMENTS = 200
#: Points per step kept for the reward-vs-duration plot (the slowest are always in).
MAX_SCATTER_POINTS = 500
#: Bad lines remembered (all are counted).
MAX_BAD_LINES = 20
#: Distinct (error type, tool) pairs kept per step (later ones are counted under "other").
MAX_ERROR_GROUPS = 50
#: Distinct agent loops counted per step (later ones are counted under "other").
MAX_AGENTS = 20
#: Characters of a listed session's first input and last output kept.
MAX_TEXT = 4000
_NS = 1e9
_MAX_NS = 1 << 63
#: A session slower than this many times its step's median is called a straggler
#: (the bridge's own watchdog default, ``straggler_factor``), when it is also longer than
#: :data:`~verl_otel_bridge._internal.stragglers.DEFAULT_MIN_S` (see :mod:`~verl_otel_bridge._internal.stragglers`).
DEFAULT_STRAGGLER_FACTOR: float = BridgeConfig.straggler_factor
DEFAULT_STRAGGLER_MIN_S: float = DEFAULT_MIN_S

#: How a session ended, as far as the capture shows.
FINISHED, UNFINISHED_KIND, HUNG, PARTIAL = "finished", "unfinished", "hung", "partial"
#: An exception's class name at the start of an error message (``ToolError: ...``).
_ERROR_CLASS = re.compile(r"([A-Za-z_][\w.]{0,80})(?::|$)")
OTHER = "other"


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

    ``turns`` counts as verl does: the session's ``num_turns`` (verl's, or the sum of its
    trajectories' ``num_turns``) when it has one, else its turn spans (``turn_spans``).
    ``context_tokens`` is the largest prompt plus completion of one generate turn (the
    final context of a multi-turn trajectory); ``generated_tokens`` sums the completions.
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
    context_tokens: int
    generated_tokens: int
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
    turn_spans: int = 0
    agent: str = ""
    #: For a session without a session span: ``progress.idle_s`` of its last progress record, and that
    #: record's time (ns since the epoch): it has been idle ``idle_s`` plus the time since then.
    idle_s: float = 0.0
    progress_ns: int = 0

    def idle_at(self, now_ns: int) -> float:
        """Seconds since the last span started in this open session, as of ``now_ns`` (0 without progress)."""
        if not self.progress_ns:
            return 0.0
        return self.idle_s + max(0, now_ns - self.progress_ns) / _NS


@dataclass(frozen=True)
class ZeroAdvantageGroup:
    """Sessions of one ``uid`` in one step whose rewards are all equal: GRPO's advantage is 0 for all."""

    uid: str
    sessions: int
    reward: float


@dataclass(frozen=True)
class ErrorGroup:
    """Error spans of one step with the same type (``error.type``, else the exception class that starts the
    message) and tool (a tool turn's ``tools``, else the span's name): how many, and the first message."""

    type: str
    tool: str
    count: int
    first: str


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
    #: The slowest sessions the straggler rule (``rule``) calls stragglers.
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
    #: All unfinished and hung sessions (``unfinished`` and ``hung`` list at most ``max_listed``).
    unfinished_count: int = 0
    hung_count: int = 0
    #: Finished sessions by agent loop (``agent_name``, else ``runner_name``; ``""``: neither).
    by_agent: dict[str, int] = field(default_factory=dict)
    #: Completion tokens of all the step's generate turns.
    generated_tokens: int = 0
    #: The first start and the last end of the step's spans (ns since the epoch).
    first_ns: int = 0
    last_ns: int = 0
    #: Error spans by type and tool, most frequent first.
    error_groups: list[ErrorGroup] = field(default_factory=list)
    rule: StragglerRule = field(default_factory=StragglerRule)

    @property
    def open(self) -> int:
        """Sessions with spans but no session span yet (hung and partial): still open, as far as the capture says."""
        return self.sessions - self.finished - self.unfinished_count

    @property
    def seconds(self) -> float:
        """From the step's first span start to its last span end."""
        return max(0, self.last_ns - self.first_ns) / _NS

    def per_second(self, count: float) -> float | None:
        """``count`` over :attr:`seconds` (None for a step of no duration)."""
        return count / self.seconds if self.seconds > 0 else None


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
    #: Who the report calls a straggler.
    rule: StragglerRule = field(default_factory=StragglerRule)


class _Session:
    __slots__ = (
        "agent",
        "context_tokens",
        "end_ns",
        "error",
        "errors",
        "first_ns",
        "generate_ns",
        "generated_tokens",
        "input",
        "keep",
        "last_ns",
        "num_turns",
        "output",
        "progress",
        "progress_at",
        "progress_elapsed",
        "progress_idle",
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
        self.status = self.agent = ""
        self.turns = self.generate_ns = self.tool_ns = self.errors = self.progress = 0
        self.context_tokens = self.generated_tokens = 0
        self.num_turns: int | None = None
        self.turn: Any = None
        self.error = self.server = self.progress_last_span = ""
        self.task_reward: float | None = None
        self.traj_reward: float | None = None
        self.progress_at = 0
        self.progress_elapsed = self.progress_idle = 0.0
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

    @property
    def verl_turns(self) -> int:
        """Turns as verl counts them when the session says (``num_turns``), else the turn spans seen."""
        return self.num_turns if self.num_turns is not None else max(self.turns, self.progress_turns)


class _Step:
    """One step's streaming state: its sessions, the slowest so far, its error spans."""

    __slots__ = ("error_groups", "error_spans", "first_ns", "last_ns", "sessions", "slowest")

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.slowest: list[tuple[int, int, str]] = []  # a min-heap of (duration ns, order, lane)
        self.error_spans = 0
        self.error_groups: dict[tuple[str, str], list[Any]] = {}  # (type, tool) -> [count, first message]
        self.first_ns = self.last_ns = 0


class ReportBuilder:
    """The streaming aggregation: :meth:`add` each record (any order, any number of files), then ask for
    :meth:`report` or one :meth:`step_report`, as often as wanted.

    ``step`` keeps one ``global_steps`` value only; ``top`` is how many slowest
    sessions each step lists; ``max_listed`` bounds the unfinished, hung and
    errored sessions listed per step (all are counted); ``rule`` says who is a straggler;
    ``phase_traces`` bounds the trainer traces kept (None: all, see :class:`.phases.PhaseCollector`).
    """

    def __init__(
        self,
        *,
        step: Any = None,
        top: int = 5,
        max_listed: int = 10,
        rule: StragglerRule | None = None,
        phase_traces: int | None = None,
    ) -> None:
        self.step_filter = step
        self.top = max(1, top)
        self.max_listed = max_listed
        self.rule = rule if rule is not None else StragglerRule(DEFAULT_STRAGGLER_FACTOR, DEFAULT_STRAGGLER_MIN_S)
        self.steps: dict[Any, _Step] = {}
        self.order = itertools.count()
        self.spans = self.outside = self.bad = self.forgotten_spans = self.records = 0
        self.bad_examples: list[tuple[str, int, str]] = []
        self.steps_seen: set[Any] = set()
        self.phases = PhaseCollector(phase_traces)
        self._floor: tuple[int, float, str] | None = None

    # -- feeding -------------------------------------------------------------------------

    def add_bad(self, path: str, number: int, problem: str) -> None:
        """Count a line that is not a span record (the first :data:`MAX_BAD_LINES` are remembered)."""
        self.bad += 1
        if len(self.bad_examples) < MAX_BAD_LINES:
            self.bad_examples.append((path, number, problem))

    def add(self, record: dict[str, Any]) -> None:
        """One span record (as :func:`~verl_otel_bridge._internal.records.parse_record` gives it)."""
        self.records += 1
        self.phases.add(record)
        attributes = record.get("attributes") or {}
        lane = attributes.get(STATE_LANE_ID)
        if not isinstance(lane, str):
            self.outside += 1
            return
        step = attributes.get(GLOBAL_STEPS, "")
        if type(step) is not int:  # the usual value needs no conversion
            step = step_key(step)
        if self._floor is not None and step not in self.steps and step_order(step) < self._floor:  # (kept: not)
            self.forgotten_spans += 1
            return
        self.steps_seen.add(step)
        if self.step_filter is not None and not _same_step(step, self.step_filter):
            return
        self.spans += 1
        state = self.steps.get(step)
        if state is None:
            state = self.steps[step] = _Step()
        session = state.sessions.get(lane)
        if session is None:
            session = state.sessions[lane] = _Session(attributes)
        start, end = record.get("start_time_ns"), record.get("end_time_ns")
        if type(start) is not int or not 0 <= start < _MAX_NS:  # time_ns, inlined: this runs for every span
            start = 0
        if type(end) is not int or not start <= end < _MAX_NS:  # a span that ends before it starts took no time
            end = start
        if not session.first_ns or start < session.first_ns:
            session.first_ns = start
        if end > session.last_ns:
            session.last_ns = end
        if not state.first_ns or start < state.first_ns:
            state.first_ns = start
        if end > state.last_ns:
            state.last_ns = end
        name = record.get("name")
        status = record.get("status") or {}
        if isinstance(status, dict) and status.get("code") == "ERROR":
            message = display(status.get("description") or attributes.get(ERROR) or name)
            session.errors += 1
            state.error_spans += 1
            if not session.error:
                session.error = message
            _count_error(state.error_groups, attributes, name, message)
        server = attributes.get(SERVER_ADDRESS)
        if server:
            session.server = sys.intern(display(server))
        if name == SESSION_SPAN_NAME:
            self._closed(state, lane, session, attributes, start, end)
        elif name == PROGRESS_SPAN_NAME:
            if end >= session.progress_at:
                session.progress_at = end
                session.progress_elapsed = finite_number(attributes.get(PROGRESS_ELAPSED_S)) or 0.0
                session.progress_idle = finite_number(attributes.get(PROGRESS_IDLE_S)) or 0.0
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
                completion = time_ns(attributes.get(COMPLETION_TOKENS))
                session.generated_tokens += completion
                context = time_ns(attributes.get(PROMPT_TOKENS)) + completion
                if context > session.context_tokens:
                    session.context_tokens = context
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
        self, state: _Step, lane: str, session: _Session, attributes: dict[str, Any], start: int, end: int
    ) -> None:
        session.session_span = True
        session.start_ns, session.end_ns = start, end
        session.status = sys.intern(display(attributes.get(STATUS, "")))
        session.agent = sys.intern(display(attributes.get(AGENT_NAME) or attributes.get(RUNNER_NAME) or ""))
        found = trajectories(attributes)
        session.traj_reward = trajectory_reward(found)
        session.num_turns = verl_turns(attributes, found)
        session.input, session.output = _text(attributes.get(INPUT)), _text(attributes.get(OUTPUT))
        if session.status == UNFINISHED:
            return  # listed on its own, segments kept
        heap = state.slowest
        entry = (end - start, next(self.order), lane)
        if len(heap) < self.top:
            heapq.heappush(heap, entry)
            return
        evicted = heapq.heapreplace(heap, entry)[2] if entry[0] > heap[0][0] else lane
        dropped = state.sessions[evicted]
        dropped.keep, dropped.segments = False, None
        dropped.input = dropped.output = ""
        dropped.input = dropped.output = ""

    def forget_before(self, step: Any) -> None:
        """Drop every step before ``step`` (in step order) and ignore records of those steps from now on
        (counted in ``forgotten_spans``): what keeps ``watch``'s memory bounded by the steps it shows."""
        self._floor = step_order(step)
        for old in [s for s in self.steps if step_order(s) < self._floor]:
            del self.steps[old]
        self.steps_seen = {s for s in self.steps_seen if step_order(s) >= self._floor}

    # -- answers ---------------------------------------------------------------------------

    def newest_steps(self, count: int) -> list[Any]:
        """The last ``count`` steps with sessions, in step order."""
        return sorted(self.steps, key=step_order)[-count:] if count > 0 else []

    def step_report(self, step: Any, trainer: StepPhases | None = None) -> StepReport:
        """The answers for one step (empty for a step without sessions)."""
        state = self.steps.get(step) or _Step()
        return _step_report(step, state, self.max_listed, self.rule, trainer)

    def report(self, files: Sequence[str]) -> Report:
        """Every step, with its trainer phases, as a :class:`Report` of ``files``."""
        steps = [self.step_report(step) for step in sorted(self.steps, key=step_order)]
        steps = _with_trainer(steps, self.phases.steps(self.step_filter), self.rule)
        present = sorted(self.steps_seen, key=step_order)
        return Report(
            steps,
            list(files),
            self.spans,
            self.outside,
            self.bad,
            list(self.bad_examples),
            present,
            records=self.records,
            rule=self.rule,
        )


def build_report(
    paths: Sequence[str | os.PathLike[str]],
    *,
    step: Any = None,
    top: int = 5,
    max_listed: int = 10,
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR,
    straggler_min_s: float = DEFAULT_STRAGGLER_MIN_S,
) -> Report:
    """Read every capture ``paths`` name (files, run or step folders: :func:`find_captures`; streamed, line by
    line) and answer per step. A folder of several runs gives its newest run (the others are listed as skipped).

    ``step`` keeps one ``global_steps`` value only (and of a run folder opens only that
    step's folder); ``top`` is how many slowest sessions each step lists; ``max_listed``
    bounds the unfinished, hung and errored sessions listed per step (all are counted); a
    session is a straggler when it took longer than ``straggler_factor`` times its step's median
    and longer than ``straggler_min_s`` seconds. Files that hold no span record (empty, cut
    short, unrelated) are skipped and listed.
    """
    builder = ReportBuilder(
        step=step, top=top, max_listed=max_listed, rule=StragglerRule(straggler_factor, straggler_min_s)
    )
    found = find_captures(
        paths, step=step if isinstance(step, int) and not isinstance(step, bool) else None, newest_run=True
    )
    reading = CaptureRecords(found.files)
    for record in reading:
        builder.add(record)
    report = builder.report([os.fspath(p) for p in found.files])
    empty = reading.empty
    report.bad_lines, report.bad_examples = reading.bad_lines, reading.bad_examples
    report.skipped = found.skipped + empty[: max(0, MAX_BAD_LINES - len(found.skipped))]
    report.skipped_count = found.skipped_count + len(empty)
    return report


def _count_error(groups: dict[tuple[str, str], list[Any]], attributes: dict[str, Any], name: Any, message: str) -> None:
    kind = attributes.get(ERROR_TYPE)
    if not isinstance(kind, str) or not kind:
        found = _ERROR_CLASS.match(message)
        kind = found.group(1) if found and found.group(1) != message else "error"
    tool = attributes.get(TOOLS) if name == TURN_SPAN_NAME else None
    key = (sys.intern(kind), sys.intern(display(tool if tool else name)))
    group = groups.get(key)
    if group is None:
        if len(groups) >= MAX_ERROR_GROUPS:
            key = (OTHER, OTHER)
            group = groups.get(key)
        if group is None:
            group = groups[key] = [0, message]
    group[0] += 1


def _step_report(
    step: Any, state: _Step, max_listed: int, rule: StragglerRule, trainer: StepPhases | None
) -> StepReport:
    members = list(state.sessions.items())
    report = StepReport(
        step=step,
        sessions=len(members),
        error_spans=state.error_spans,
        first_ns=state.first_ns,
        last_ns=state.last_ns,
        rule=rule,
        trainer=trainer,
    )
    finished = [(lane, s) for lane, s in members if s.kind == FINISHED]
    report.finished = len(finished)
    durations = sorted((s.end_ns - s.start_ns) / _NS for _, s in finished)
    if durations:
        report.p50_s, report.p90_s, report.max_s = (
            _percentile(durations, 0.5),
            _percentile(durations, 0.9),
            durations[-1],
        )
    slow_lanes = {lane for _, _, lane in state.slowest}
    slowest = [_summary(step, lane, s) for lane, s in finished if lane in slow_lanes]
    report.slowest = sorted(slowest, key=lambda s: -s.duration_s)
    report.stragglers = [s for s in report.slowest if rule.is_straggler(s.duration_s, report.p50_s)]
    for kind, target in ((UNFINISHED_KIND, report.unfinished), (HUNG, report.hung)):
        chosen = sorted((m for m in members if m[1].kind == kind), key=lambda m: -_summary_age(m[1]))
        target.extend(_summary(step, lane, s) for lane, s in chosen[:max_listed])
        if kind == HUNG:
            report.hung_count = len(chosen)
        else:
            report.unfinished_count = len(chosen)
    report.partial = sum(1 for _, s in members if s.kind == PARTIAL)
    report.errored = [_summary(step, lane, s, segments=False) for lane, s in members if s.errors][:max_listed]
    report.zero_advantage = _zero_advantage(members)
    agents: dict[str, int] = {}
    for _, s in finished:
        name = s.agent if s.agent in agents or len(agents) < MAX_AGENTS else OTHER
        agents[name] = agents.get(name, 0) + 1
    report.by_agent = dict(sorted(agents.items(), key=lambda item: (-item[1], item[0])))
    report.generated_tokens = sum(s.generated_tokens for _, s in members)
    report.error_groups = sorted(
        (ErrorGroup(kind, tool, count, first) for (kind, tool), (count, first) in state.error_groups.items()),
        key=lambda g: (-g.count, g.type, g.tool),
    )
    _rewards(report, finished, slow_lanes)
    return report


def open_sessions(
    builder: ReportBuilder, step: Any, limit: int, now_ns: int, idle_after_s: float
) -> list[SessionSummary]:
    """The open sessions of ``step`` (progress records, no session span yet) idle longer than ``idle_after_s``
    as of ``now_ns``, the longest idle first, at most ``limit``."""
    state = builder.steps.get(step)
    if state is None:
        return []
    found = [_summary(step, lane, s, segments=False) for lane, s in state.sessions.items() if s.kind == HUNG]
    idle = [s for s in found if s.idle_at(now_ns) > idle_after_s]
    return sorted(idle, key=lambda s: -s.idle_at(now_ns))[:limit]


def _with_trainer(steps: list[StepReport], trainer: list[StepPhases], rule: StragglerRule) -> list[StepReport]:
    """Each step with its ``training_step`` (a step the trainer traced but no session reached is added)."""
    found = by_step(trainer)
    for report in steps:
        report.trainer = found.pop(report.step, None)
    steps.extend(StepReport(step=value, trainer=phases, rule=rule) for value, phases in found.items())
    return sorted(steps, key=lambda report: step_order(report.step))


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
        turns=s.verl_turns,
        generate_s=s.generate_ns / _NS,
        tool_s=s.tool_ns / _NS,
        context_tokens=s.context_tokens,
        generated_tokens=s.generated_tokens,
        reward=s.reward,
        server=s.server,
        errors=s.errors,
        error=s.error,
        progress_records=s.progress,
        last_span=s.progress_last_span,
        segments=tuple(sorted(s.segments or (), key=lambda g: g.start_ns)) if segments else (),
        segments_cut=s.segments_cut,
        turn_spans=s.turns,
        agent=s.agent,
        idle_s=s.progress_idle if kind == HUNG else 0.0,
        progress_ns=s.progress_at if kind == HUNG else 0,
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


def _rewards(report: StepReport, finished: list[tuple[str, _Session]], slow: set[str]) -> None:
    rows = [
        ((s.end_ns - s.start_ns) / _NS, s.reward, s.verl_turns, lane) for lane, s in finished if s.reward is not None
    ]
    report.rewarded = len(rows)
    if not rows:
        return
    rewards = [r for _, r, _, _ in rows if r is not None]
    report.reward_mean = sum(rewards) / len(rewards)
    report.reward_vs_duration = _pearson([d for d, *_ in rows], rewards)
    report.reward_vs_turns = _pearson([float(t) for _, _, t, _ in rows], rewards)
    stride = max(1, math.ceil(len(rows) / MAX_SCATTER_POINTS))
    report.points = [
        (d, r, t, lane) for i, (d, r, t, lane) in enumerate(rows) if r is not None and (i % stride == 0 or lane in slow)
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


def _same_step(value: Any, wanted: Any) -> bool:
    return bool(value == wanted or str(value) == str(wanted))


def step_order(step: Any) -> tuple[int, float, str]:
    """How steps sort: numbers first, in order, then any other value by its text."""
    number = finite_number(step)
    if number is not None:
        return (0, number, "")
    return (1, 0.0, str(step))
