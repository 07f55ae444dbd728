"""The trainer's side of a capture: per training step, its phases (verl's timers), its metrics and the
sessions under its phases.

Reads what :mod:`verl_otel_bridge._internal.verl.trainer` writes: a ``training_step`` span, its
phase spans (``training.phase``, nested as verl nests its timers), its
``training_step.metrics`` records, and the ``agent_session`` spans in the same trace
(children of ``gen``, written by the Ray workers, possibly in other files). Records
arrive in any order; a session is kept as a few numbers, at most
:data:`MAX_TIMELINE_SESSIONS` per trace (the rest are counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from verl_otel_bridge._internal.protocol import (
    PHASE,
    SESSION_SPAN_NAME,
    STATUS,
    STEP_METRIC_PREFIX,
    STEP_METRICS_SPAN_NAME,
    TRAINING_STEP_SPAN_NAME,
)
from verl_otel_bridge._internal.report.values import span_id as read_span_id
from verl_otel_bridge._internal.report.values import step_key, time_ns

#: Sessions kept per trace for the timeline; later ones are counted, not kept.
MAX_TIMELINE_SESSIONS = 500
#: The span names this module keeps (besides phases, known by their ``training.phase`` attribute).
_KEPT_NAMES = frozenset({SESSION_SPAN_NAME, STEP_METRICS_SPAN_NAME, TRAINING_STEP_SPAN_NAME})
#: Deepest phase nesting followed (verl nests two levels: ``step`` > ``gen``).
_MAX_DEPTH = 16
_NS = 1e9


class _Timed:
    """Something with a start and an end (ns since the epoch)."""

    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        """How long it took."""
        return (self.end_ns - self.start_ns) / _NS


@dataclass(frozen=True)
class Phase(_Timed):
    """One phase span: verl's timer name, its times (ns since the epoch) and depth under the step (0: a child)."""

    name: str
    span_id: str
    start_ns: int
    end_ns: int
    depth: int
    error: bool


@dataclass(frozen=True)
class TimelineSession(_Timed):
    """A session in a step's trace: its lane, times, status and the phase it ran under (``""``: none)."""

    state_lane_id: str
    start_ns: int
    end_ns: int
    status: str
    phase: str


@dataclass
class StepPhases(_Timed):
    """One ``training_step`` span and what hangs under it; its ``seconds`` run from its first timer to verl
    logging its metrics."""

    step: Any
    trace_id: str
    start_ns: int
    end_ns: int
    error: bool
    #: In start order (a parent before its children).
    phases: list[Phase] = field(default_factory=list)
    sessions: list[TimelineSession] = field(default_factory=list)
    sessions_cut: int = 0
    #: The logged metrics, by verl's key.
    metrics: dict[str, Any] = field(default_factory=dict)

    def share(self, phase: Phase) -> float | None:
        """``phase``'s part of the step (0..1), None for a step of no duration."""
        return phase.seconds / self.seconds if self.end_ns > self.start_ns else None

    def sessions_under(self, name: str) -> list[TimelineSession]:
        """The sessions that ran under the phase ``name`` (e.g. ``gen``), by start."""
        return [s for s in self.sessions if s.phase == name]


@dataclass
class _Span:
    name: str
    parent: str | None
    trace_id: str
    start_ns: int
    end_ns: int
    error: bool


@dataclass(frozen=True)
class RunningStep:
    """A training step still open: the phases that have ended in its trace so far (no ``training_step``
    span yet, it is exported when the step ends)."""

    trace_id: str
    #: In start order; depth as in :class:`Phase`, counted under the open step.
    phases: list[Phase]

    @property
    def start_ns(self) -> int:
        """The first phase's start."""
        return min(phase.start_ns for phase in self.phases)

    @property
    def last_end_ns(self) -> int:
        """When the last phase that ended ended: what runs since then is not known yet."""
        return max(phase.end_ns for phase in self.phases)


class PhaseCollector:
    """Streams records (:meth:`add`) and gives the steps found (:meth:`steps`).

    ``max_traces`` bounds what is kept to the traces most recently added to (a live view's
    memory); None keeps every one (a report of whole captures).
    """

    def __init__(self, max_traces: int | None = None) -> None:
        self._steps: dict[str, tuple[_Span, Any]] = {}
        self._phases: dict[str, _Span] = {}
        self._metrics: dict[str, dict[str, Any]] = {}
        self._metrics_trace: dict[str, str] = {}
        self._sessions: dict[str, list[tuple[str, str | None, int, int, str]]] = {}
        self._sessions_cut: dict[str, int] = {}
        self._max_traces = max_traces
        self._traces: dict[str, None] = {}  # in the order last added to (oldest first)

    def add(self, record: dict[str, Any]) -> None:
        """Keep ``record`` if it is part of a step's picture (a step, a phase, metrics or a session)."""
        name = record.get("name")
        attributes = record.get("attributes")
        if not isinstance(attributes, dict) or (name not in _KEPT_NAMES and PHASE not in attributes):
            return  # most records: a turn, a tool call
        span_id = read_span_id(record.get("span_id"))
        if span_id is None:
            return
        if name == SESSION_SPAN_NAME:
            self._session(record, attributes)
        elif name == STEP_METRICS_SPAN_NAME:
            parent = read_span_id(record.get("parent_span_id"))
            if parent is None:
                return
            metrics = self._metrics.setdefault(parent, {})
            self._metrics_trace[parent] = str(record.get("trace_id"))
            for key, value in attributes.items():
                if key.startswith(STEP_METRIC_PREFIX):
                    metrics[key[len(STEP_METRIC_PREFIX) :]] = value
        elif name == TRAINING_STEP_SPAN_NAME:
            self._steps[span_id] = (_span(record, str(name)), step_key(attributes.get("global_steps")))
        elif PHASE in attributes:
            self._phases[span_id] = _span(record, str(attributes[PHASE]))
        else:
            return
        if self._max_traces is not None:
            self._touch(str(record.get("trace_id")))

    def _touch(self, trace_id: str) -> None:
        traces = self._traces
        traces.pop(trace_id, None)
        traces[trace_id] = None
        if self._max_traces is not None and len(traces) > self._max_traces:
            self._forget(next(iter(traces)))

    def _forget(self, trace_id: str) -> None:
        self._traces.pop(trace_id, None)
        self._sessions.pop(trace_id, None)
        self._sessions_cut.pop(trace_id, None)
        for table in (self._steps, self._phases):
            for key in [k for k, v in table.items() if _trace_of(v) == trace_id]:
                del table[key]
        for key in [k for k, t in self._metrics_trace.items() if t == trace_id]:
            del self._metrics_trace[key]
            self._metrics.pop(key, None)

    def running(self) -> RunningStep | None:
        """The training step most recently added to whose ``training_step`` span has not come yet, if any."""
        closed = {span.trace_id for span, _ in self._steps.values()}
        open_traces: dict[str, list[tuple[str, _Span]]] = {}
        for span_id, span in self._phases.items():
            if span.trace_id not in closed:
                open_traces.setdefault(span.trace_id, []).append((span_id, span))
        if not open_traces:
            return None
        trace_id = max(open_traces, key=lambda t: max(span.end_ns for _, span in open_traces[t]))
        phases = [
            Phase(span.name, span_id, span.start_ns, span.end_ns, self._root(span)[1], span.error)
            for span_id, span in open_traces[trace_id]
        ]
        return RunningStep(trace_id, sorted(phases, key=lambda phase: (phase.start_ns, phase.depth)))

    def _session(self, record: dict[str, Any], attributes: dict[str, Any]) -> None:
        trace_id = str(record.get("trace_id"))
        kept = self._sessions.setdefault(trace_id, [])
        if len(kept) >= MAX_TIMELINE_SESSIONS:
            self._sessions_cut[trace_id] = self._sessions_cut.get(trace_id, 0) + 1
            return
        kept.append(
            (
                str(attributes.get("state_lane_id", "")),
                read_span_id(record.get("parent_span_id")),
                time_ns(record.get("start_time_ns")),
                time_ns(record.get("end_time_ns")),
                str(attributes.get(STATUS, "")),
            )
        )

    def steps(self, step_filter: Any = None) -> list[StepPhases]:
        """Every ``training_step`` read (only those of ``step_filter`` if given), in start order."""
        found: dict[str, StepPhases] = {}
        for span_id, (span, step) in self._steps.items():
            if step_filter is not None and str(step) != str(step_filter):
                continue
            found[span_id] = StepPhases(
                step=step,
                trace_id=span.trace_id,
                start_ns=span.start_ns,
                end_ns=span.end_ns,
                error=span.error,
                metrics=self._metrics.get(span_id, {}),
            )
        placed: dict[str, tuple[StepPhases, str]] = {}  # phase span id -> its step, its name
        for span_id, span in self._phases.items():
            root, depth = self._root(span)
            owner = found.get(root) if root is not None else None
            if owner is not None:
                owner.phases.append(Phase(span.name, span_id, span.start_ns, span.end_ns, depth, span.error))
                placed[span_id] = (owner, span.name)
        by_trace: dict[str, list[StepPhases]] = {}
        for owner in found.values():
            owner.phases.sort(key=lambda phase: (phase.start_ns, phase.depth))
            by_trace.setdefault(owner.trace_id, []).append(owner)
        for trace_id, sessions in self._sessions.items():
            owners = by_trace.get(trace_id, [])
            for lane, parent, start, end, status in sessions:
                owner, phase = placed.get(parent or "", (None, ""))
                if owner is None:
                    owner = found.get(parent or "") or (owners[0] if len(owners) == 1 else None)
                if owner is not None:
                    owner.sessions.append(TimelineSession(lane, start, end, status, phase))
            for owner in owners:
                owner.sessions_cut = self._sessions_cut.get(trace_id, 0)
        for owner in found.values():
            owner.sessions.sort(key=lambda s: (s.start_ns, s.state_lane_id))
        return sorted(found.values(), key=lambda s: s.start_ns)

    def _root(self, span: _Span) -> tuple[str | None, int]:
        """The span id above the phase chain (the step's, when it is one) and the phase's depth under it."""
        parent, depth = span.parent, 0
        while parent in self._phases and depth < _MAX_DEPTH:
            parent = self._phases[parent].parent
            depth += 1
        return parent, depth


def _trace_of(value: _Span | tuple[_Span, Any]) -> str:
    return value[0].trace_id if isinstance(value, tuple) else value.trace_id


def _span(record: dict[str, Any], name: str) -> _Span:
    status = record.get("status") or {}
    return _Span(
        name=name,
        parent=read_span_id(record.get("parent_span_id")),
        trace_id=str(record.get("trace_id")),
        start_ns=time_ns(record.get("start_time_ns")),
        end_ns=time_ns(record.get("end_time_ns")),
        error=isinstance(status, dict) and status.get("code") == "ERROR",
    )


#: The columns of :func:`phase_rows`.
PHASE_COLUMNS = ("phase", "seconds", "share", "sessions", "slowest s")


def phase_rows(step: StepPhases) -> list[dict[str, str]]:
    """The phase breakdown as display strings: phase (indented by depth), seconds, share of the step, and
    the sessions that ran under it with the slowest one's seconds (what the phase waited for)."""
    rows = []
    for phase in step.phases:
        share = step.share(phase)
        under = step.sessions_under(phase.name)
        rows.append(
            {
                "phase": "  " * phase.depth + phase.name + (" (error)" if phase.error else ""),
                "seconds": f"{phase.seconds:.3f}",
                "share": "-" if share is None else f"{share:.0%}",
                "sessions": str(len(under)) if under else "",
                "slowest s": f"{max(s.seconds for s in under):.3f}" if under else "",
            }
        )
    return rows


def by_step(steps: Iterable[StepPhases]) -> dict[Any, StepPhases]:
    """Steps by ``global_steps`` (the later of two with the same value wins)."""
    return {step.step: step for step in steps}
