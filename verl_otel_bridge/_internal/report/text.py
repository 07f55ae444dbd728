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
    SESSION_COLUMNS_NOTE,
    SLOWEST_COLUMNS,
    STEP_COLUMNS,
    reward_text,
    rule_text,
    seconds,
    session_row,
    skipped_lines,
    step_headline,
    step_rows,
    straggler_text,
    zero_advantage_text,
)
from verl_otel_bridge._internal.report.values import step_label
from verl_otel_bridge._internal.tree import printable

if TYPE_CHECKING:
    from rich.console import RenderableType


def renderables(report: Report, *, text: bool = False) -> list[RenderableType]:
    """The report as ``rich`` renderables: the step table, then each step's details (with ``text``, the first
    input and last output of each slowest session)."""
    out: list[RenderableType] = []
    steps = table("Steps (done: finished sessions; err: error spans; 0-adv: zero-advantage groups)")
    for column in STEP_COLUMNS:
        steps.add_column(column, justify="left" if column == "step" else "right")
    for row in step_rows(report):
        steps.add_row(*(safe_text(row[c]) for c in STEP_COLUMNS))
    out.append(steps)
    for step in report.steps:
        out.extend(_step(step))
        if text:
            out.extend(_conversations(step.slowest))
    read = (
        f"{report.spans} spans in sessions from {len(report.files)} files; "
        f"{report.outside_sessions} spans outside sessions; {report.bad_lines} bad lines"
    )
    out.append(safe_text(read))
    out.append(safe_text(rule_text(report.rule)))
    if any(step.slowest for step in report.steps):
        out.append(safe_text(SESSION_COLUMNS_NOTE))
    for path, line, problem in report.bad_examples[:5]:
        out.append(safe_text(f"{path}:{line}: {problem}"))
    out.extend(safe_text(line) for line in skipped_lines(report))
    return out


def _step(step: StepReport) -> list[RenderableType]:
    parts: list[RenderableType] = [
        safe_text(""),  # a blank line before each step (a newline inside the text would be escaped)
        safe_text(step_headline(step), style="bold"),
    ]
    if step.trainer is not None:
        parts.extend(phase_parts(step.trainer))
    if step.slowest:
        parts.append(sessions_table(f"slowest sessions of step {step_label(step.step)}", step.slowest, SLOWEST_COLUMNS))
    for s in step.stragglers:
        parts.append(safe_text(f"straggler: {straggler_text(step, s)}", style="yellow"))
    if step.unfinished:
        parts.append(sessions_table("unfinished at shutdown", step.unfinished, OPEN_COLUMNS))
    if step.hung:
        parts.append(sessions_table("hung: progress records but no session span", step.hung, OPEN_COLUMNS))
    if step.partial:
        parts.append(safe_text(f"{step.partial} sessions with some spans but neither a session span nor progress"))
    if step.errored:
        parts.append(sessions_table(f"errors ({step.error_spans} error spans)", step.errored, ERROR_COLUMNS))
    for group in step.zero_advantage[:LISTED]:
        parts.append(safe_text(f"zero advantage: {zero_advantage_text(group)}"))
    if len(step.zero_advantage) > LISTED:
        parts.append(safe_text(f"... and {len(step.zero_advantage) - LISTED} more zero-advantage groups"))
    if step.rewarded:
        parts.append(safe_text(reward_text(step)))
    return parts


def safe_text(text: str, style: str = "") -> Any:
    """Text from a capture for a terminal: control characters escaped (rich leaves escape sequences in)."""
    from rich.text import Text

    return Text(printable(text), style=style)


def table(title: str) -> Any:
    """An empty table in the report's style, titled ``title`` (escaped)."""
    from rich import box
    from rich.table import Table

    return Table(title=safe_text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))


def sessions_table(title: str, sessions: Sequence[SessionSummary], columns: Sequence[str]) -> Any:
    """``sessions`` as a table of ``columns`` (names of :func:`session_row`)."""
    out = table(title)
    for column in columns:
        out.add_column(column, justify="left" if column in ("uid", "last span", "first error", "server") else "right")
    for s in sessions:
        row = session_row(s)
        out.add_row(*(safe_text(row[c]) for c in columns))
    return out


def _conversations(sessions: Sequence[SessionSummary]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for s in sessions:
        if s.input or s.output:
            out.append(safe_text(f"sample {s.sample} session {s.session}: first input", style="bold"))
            out.append(safe_text(s.input or "-"))
            out.append(safe_text(f"sample {s.sample} session {s.session}: last output", style="bold"))
            out.append(safe_text(s.output or "-"))
    return out


def phase_parts(trainer: StepPhases) -> list[RenderableType]:
    """The step's phase breakdown: each of verl's timers, its seconds and share of the training step."""
    header = safe_text(
        f"phases: training_step {seconds(trainer.seconds)}, {len(trainer.metrics)} metrics logged"
        + (" (ended with an error)" if trainer.error else "")
    )
    out = table("")
    for column in PHASE_COLUMNS:
        out.add_column(column, justify="left" if column == "phase" else "right")
    for row in phase_rows(trainer):
        out.add_row(*(safe_text(row[c]) for c in PHASE_COLUMNS))
    return [header, out]
