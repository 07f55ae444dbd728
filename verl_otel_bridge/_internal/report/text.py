"""A :class:`~verl_otel_bridge.report.Report` as ``rich`` tables, for a terminal (the ``cli`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verl_otel_bridge._internal.report.aggregate import Report, SessionSummary, StepReport
from verl_otel_bridge._internal.report.phases import PHASE_COLUMNS, StepPhases, phase_rows
from verl_otel_bridge._internal.report.rows import (
    ERROR_COLUMNS,
    LISTED,
    OPEN_COLUMNS,
    SLOWEST_COLUMNS,
    STEP_COLUMNS,
    number,
    seconds,
    session_row,
    skipped_lines,
    step_rows,
)
from verl_otel_bridge._internal.tree import printable

if TYPE_CHECKING:
    from rich.console import RenderableType


def renderables(report: Report, *, text: bool = False) -> list[RenderableType]:
    """The report as ``rich`` renderables: the step table, then each step's details (with ``text``, the first
    input and last output of each slowest session)."""
    out: list[RenderableType] = []
    table = _table("Steps (done: finished sessions; err: error spans; 0-adv: zero-advantage groups)")
    for column in STEP_COLUMNS:
        table.add_column(column, justify="left" if column == "step" else "right")
    for row in step_rows(report):
        table.add_row(*(_text(row[c]) for c in STEP_COLUMNS))
    out.append(table)
    for step in report.steps:
        out.extend(_step(step))
        if text:
            out.extend(_conversations(step.slowest))
    read = (
        f"{report.spans} spans in sessions from {len(report.files)} files; "
        f"{report.outside_sessions} spans outside sessions; {report.bad_lines} bad lines"
    )
    out.append(_text(read))
    for path, line, problem in report.bad_examples[:5]:
        out.append(_text(f"{path}:{line}: {problem}"))
    out.extend(_text(line) for line in skipped_lines(report))
    return out


def _step(step: StepReport) -> list[RenderableType]:
    parts: list[RenderableType] = [
        _text(""),  # a blank line before each step (a newline inside the text would be escaped)
        _text(
            f"step {step.step}: {step.sessions} sessions, {step.finished} finished; duration p50 "
            f"{seconds(step.p50_s)}, p90 {seconds(step.p90_s)}, max {seconds(step.max_s)}",
            style="bold",
        ),
    ]
    if step.trainer is not None:
        parts.extend(_phases(step.trainer))
    if step.slowest:
        parts.append(_sessions(f"slowest sessions of step {step.step}", step.slowest, SLOWEST_COLUMNS))
    for s in step.stragglers:
        ratio = s.duration_s / step.p50_s if step.p50_s else float("inf")
        parts.append(
            _text(
                f"straggler: uid {s.uid!r} sample {s.sample} session {s.session}: {s.duration_s:.3f} s, "
                f"{ratio:.0f} x the median (generate {s.generate_s:.3f} s, tool {s.tool_s:.3f} s)",
                style="yellow",
            )
        )
    if step.unfinished:
        parts.append(_sessions("unfinished at shutdown", step.unfinished, OPEN_COLUMNS))
    if step.hung:
        parts.append(_sessions("hung: progress records but no session span", step.hung, OPEN_COLUMNS))
    if step.partial:
        parts.append(_text(f"{step.partial} sessions with some spans but neither a session span nor progress"))
    if step.errored:
        parts.append(_sessions(f"errors ({step.error_spans} error spans)", step.errored, ERROR_COLUMNS))
    for group in step.zero_advantage[:LISTED]:
        parts.append(
            _text(f"zero advantage: uid {group.uid!r}: all {group.sessions} sessions got reward {group.reward:g}")
        )
    if len(step.zero_advantage) > LISTED:
        parts.append(_text(f"... and {len(step.zero_advantage) - LISTED} more zero-advantage groups"))
    if step.rewarded:
        parts.append(
            _text(
                f"reward: mean {number(step.reward_mean)} over {step.rewarded} sessions; "
                f"r(reward, duration) = {number(step.reward_vs_duration, 2)}, "
                f"r(reward, turns) = {number(step.reward_vs_turns, 2)}"
            )
        )
    return parts


def _text(text: str, style: str = "") -> Any:
    """Capture text for a terminal: control characters escaped (rich leaves escape sequences in)."""
    from rich.text import Text

    return Text(printable(text), style=style)


def _table(title: str) -> Any:
    from rich import box
    from rich.table import Table

    return Table(title=_text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))


def _sessions(title: str, sessions: Sequence[SessionSummary], columns: Sequence[str]) -> Any:
    table = _table(title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("uid", "last span", "first error", "server") else "right")
    for s in sessions:
        row = session_row(s)
        table.add_row(*(_text(row[c]) for c in columns))
    return table


def _conversations(sessions: Sequence[SessionSummary]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for s in sessions:
        if s.input or s.output:
            out.append(_text(f"sample {s.sample} session {s.session}: first input", style="bold"))
            out.append(_text(s.input or "-"))
            out.append(_text(f"sample {s.sample} session {s.session}: last output", style="bold"))
            out.append(_text(s.output or "-"))
    return out


def _phases(trainer: StepPhases) -> list[RenderableType]:
    """The step's phase breakdown: each of verl's timers, its seconds and share of the training step."""
    header = _text(
        f"phases: training_step {seconds(trainer.seconds)}, {len(trainer.metrics)} metrics logged"
        + (" (ended with an error)" if trainer.error else "")
    )
    table = _table("")
    for column in PHASE_COLUMNS:
        table.add_column(column, justify="left" if column == "phase" else "right")
    for row in phase_rows(trainer):
        table.add_row(*(_text(row[c]) for c in PHASE_COLUMNS))
    return [header, table]
