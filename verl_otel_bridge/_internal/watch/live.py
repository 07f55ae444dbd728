"""What ``verl-otel-bridge watch`` knows: the report's own aggregation (:class:`ReportBuilder`), fed line by
line as captures grow, holding the newest steps only.

Two steps are kept whole (the newest and the one before, whose late sessions may
still arrive); records of older steps are counted and dropped, so memory is bounded
by the sessions of two steps, whatever the length of the run. A :class:`Snapshot`
is the newest step's :class:`StepReport` (the figures ``report`` prints for that
step, computed by the same functions), the previous step's, the open sessions idle
longer than the threshold and the trainer's running step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from verl_otel_bridge._internal.protocol import EXPERIMENT_NAME, PROJECT, SESSION_SPAN_NAME
from verl_otel_bridge._internal.records import parse_record
from verl_otel_bridge._internal.report.aggregate import ReportBuilder, SessionSummary, StepReport, open_sessions
from verl_otel_bridge._internal.report.phases import RunningStep, by_step
from verl_otel_bridge._internal.stragglers import StragglerRule
from verl_otel_bridge._internal.tree import display
from verl_otel_bridge._internal.watch.follow import Lines

#: Steps kept whole: the newest and the previous one.
KEPT_STEPS = 2
#: Trainer traces kept (each training step is one; sessions outside the trainer are one each).
KEPT_TRACES = 64
#: Default threshold: an open session whose last span started longer ago than this looks hung.
DEFAULT_IDLE_AFTER_S = 120.0


@dataclass
class Snapshot:
    """One screen's worth: what was read, and the answers for the newest steps."""

    now_ns: int
    files: int
    spans: int
    bad_lines: int
    bad_examples: list[tuple[str, int, str]]
    #: Spans of steps older than the two kept, arriving late: counted, not shown.
    forgotten_spans: int
    #: Files that cannot be read (path, why).
    broken: list[tuple[str, str]]
    run: str
    step: StepReport | None
    previous: StepReport | None
    #: Open sessions of the newest step idle longer than ``idle_after_s``, the longest idle first.
    hung: list[SessionSummary]
    idle_after_s: float
    running: RunningStep | None
    rule: StragglerRule = field(default_factory=StragglerRule)


class LiveView:
    """Feed it what a :class:`~verl_otel_bridge._internal.watch.follow.Follower` finds; ask for a :meth:`snapshot`."""

    def __init__(
        self,
        *,
        rule: StragglerRule | None = None,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        top: int = 5,
        listed: int = 5,
    ) -> None:
        self.builder = ReportBuilder(top=top, max_listed=listed, rule=rule, phase_traces=KEPT_TRACES)
        self.idle_after_s = idle_after_s
        self.listed = listed
        self.files: set[str] = set()
        self.broken: dict[str, str] = {}
        self.run = ""

    def feed(self, found: Lines) -> None:
        """The new lines of one file."""
        path = os.fspath(found.path)
        self.files.add(path)
        builder = self.builder
        for line in found.lines:
            if line.data is None:
                builder.add_bad(path, line.number, "a line too long to read")
                continue
            if not line.data or line.data.isspace():
                continue
            record, problem = parse_record(line.data)
            if record is None:
                builder.add_bad(path, line.number, problem or "unreadable")
                continue
            builder.add(record)
            if record["name"] == SESSION_SPAN_NAME:
                self._saw_run(record.get("attributes") or {})
        newest = builder.newest_steps(KEPT_STEPS)
        if len(builder.steps) > KEPT_STEPS:
            builder.forget_before(newest[0])

    def _saw_run(self, attributes: dict[str, Any]) -> None:
        names = [display(attributes.get(key) or "") for key in (PROJECT, EXPERIMENT_NAME)]
        self.run = "/".join(name for name in names if name)

    def mark_broken(self, broken: dict[str, str]) -> None:
        """The files that cannot be followed (path -> why)."""
        self.broken = dict(broken)

    def snapshot(self, now_ns: int) -> Snapshot:
        """The answers as of ``now_ns`` (ns since the epoch)."""
        builder = self.builder
        steps = builder.newest_steps(KEPT_STEPS)
        trainer = by_step(builder.phases.steps())
        reports = [builder.step_report(step, trainer.get(step)) for step in steps]
        newest = reports[-1] if reports else None
        return Snapshot(
            now_ns=now_ns,
            files=len(self.files),
            spans=builder.spans,
            bad_lines=builder.bad,
            bad_examples=list(builder.bad_examples),
            forgotten_spans=builder.forgotten_spans,
            broken=sorted(self.broken.items()),
            run=self.run,
            step=newest,
            previous=reports[-2] if len(reports) > 1 else None,
            hung=open_sessions(builder, newest.step, self.listed, now_ns, self.idle_after_s) if newest else [],
            idle_after_s=self.idle_after_s,
            running=builder.phases.running(),
            rule=builder.rule,
        )
