"""A :class:`~verl_otel_bridge._internal.watch.live.Snapshot` for people: ``rich`` renderables for a terminal
(the ``cli`` extra) and one plain line for logs.

Every figure is formatted by the report's own functions
(:mod:`verl_otel_bridge._internal.report.rows`), every text from a capture escaped as
the report escapes it (:func:`~verl_otel_bridge._internal.report.text.safe_text`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from verl_otel_bridge._internal.report.aggregate import SessionSummary, StepReport
from verl_otel_bridge._internal.report.phases import RunningStep
from verl_otel_bridge._internal.report.rows import (
    number,
    reward_text,
    rule_text,
    session_row,
    step_headline,
    straggler_text,
    zero_advantage_text,
)
from verl_otel_bridge._internal.report.text import phase_parts, safe_text, table
from verl_otel_bridge._internal.tree import printable
from verl_otel_bridge._internal.watch.live import Snapshot

if TYPE_CHECKING:
    from rich.console import RenderableType

#: Rows per list on the screen (all are counted).
SHOWN = 5
_NS = 1e9

HUNG_COLUMNS = ("uid", "sample", "session", "dur s", "idle s", "turns", "last span")
SLOW_COLUMNS = ("uid", "sample", "session", "dur s", "turns", "gen s", "tool s", "gen tok", "reward", "straggler")


def renderables(snapshot: Snapshot, title: str) -> list[RenderableType]:
    """The whole screen: what is read, the newest step, its trainer phases, hung sessions, the slowest,
    errors, and the previous step in one line."""
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.now_ns / _NS))
    run = f" run {snapshot.run}" if snapshot.run else ""
    out: list[RenderableType] = [
        safe_text(f"verl-otel-bridge watch {title}{run}  {clock}", style="bold"),
        _read(snapshot),
    ]
    step = snapshot.step
    if step is None:
        out.append(safe_text("waiting for the first session's spans ..."))
    else:
        out.extend(_step(step, snapshot))
    if snapshot.running is not None:
        out.append(_running(snapshot.running, snapshot.now_ns))
    if step is not None and step.trainer is not None:
        out.extend(phase_parts(step.trainer))
    if snapshot.previous is not None:
        out.append(safe_text(f"previous {summary_line(snapshot.previous)}", style="dim"))
    out.append(safe_text(rule_text(snapshot.rule), style="dim"))
    return out


def _read(snapshot: Snapshot) -> Any:
    parts = [f"{snapshot.files} files, {snapshot.spans} spans in sessions", f"{snapshot.bad_lines} bad lines"]
    if snapshot.forgotten_spans:
        parts.append(f"{snapshot.forgotten_spans} late spans of older steps not shown")
    text = "; ".join(parts)
    if snapshot.bad_examples:
        path, line, problem = snapshot.bad_examples[-1]
        text += f" (last: {path}:{line}: {problem})"
    for path, why in snapshot.broken[:3]:
        text += f"; {path}: {why}"
    return safe_text(text, style="red" if snapshot.bad_lines or snapshot.broken else "dim")


def _step(step: StepReport, snapshot: Snapshot) -> list[RenderableType]:
    agents = ", ".join(f"{name or '(unnamed)'} {count}" for name, count in list(step.by_agent.items())[:4])
    counts = f"{step.finished} finished" + (f" ({agents})" if agents else "") + f", {step.open} open"
    if step.unfinished_count:
        counts += f", {step.unfinished_count} unfinished"
    rates = (
        f"{number(step.per_second(step.finished), 2)} sessions/s, "
        f"{number(step.per_second(step.generated_tokens), 0)} tokens/s generated over {step.seconds:.1f} s"
    )
    out: list[RenderableType] = [
        safe_text(""),
        safe_text(step_headline(step), style="bold"),
        safe_text(f"sessions: {counts}; {rates}"),
    ]
    if step.rewarded:
        out.append(safe_text(reward_text(step)))
    if step.zero_advantage:
        groups = "; ".join(zero_advantage_text(g) for g in step.zero_advantage[:3])
        more = f" (and {len(step.zero_advantage) - 3} more)" if len(step.zero_advantage) > 3 else ""
        out.append(safe_text(f"zero advantage: {len(step.zero_advantage)} groups: {groups}{more}", style="yellow"))
    if snapshot.hung:
        out.append(_hung(snapshot.hung, snapshot))
    elif step.open:
        out.append(safe_text(f"no open session idle longer than {snapshot.idle_after_s:g} s"))
    if step.slowest:
        out.append(_slowest(step))
    for s in step.stragglers:
        out.append(safe_text(f"straggler: {straggler_text(step, s)}", style="yellow"))
    if step.error_groups:
        out.append(_errors(step))
    return out


def _hung(hung: list[SessionSummary], snapshot: Snapshot) -> Any:
    out = table(f"hung: open, idle longer than {snapshot.idle_after_s:g} s")
    for column in HUNG_COLUMNS:
        out.add_column(column, justify="left" if column in ("uid", "last span") else "right")
    for s in hung[:SHOWN]:
        row = session_row(s)
        row["idle s"] = number(s.idle_at(snapshot.now_ns), 1)
        row["dur s"] = number(s.duration_s + max(0, snapshot.now_ns - s.progress_ns) / _NS, 1)
        out.add_row(*(safe_text(row[c], style="red" if c == "last span" else "") for c in HUNG_COLUMNS))
    return out


def _slowest(step: StepReport) -> Any:
    stragglers = {s.state_lane_id for s in step.stragglers}
    out = table("slowest finished sessions")
    for column in SLOW_COLUMNS:
        out.add_column(column, justify="left" if column in ("uid", "straggler") else "right")
    for s in step.slowest[:SHOWN]:
        row = session_row(s)
        row["straggler"] = "yes" if s.state_lane_id in stragglers else ""
        out.add_row(*(safe_text(row[c]) for c in SLOW_COLUMNS))
    return out


def _errors(step: StepReport) -> Any:
    out = table(f"errors: {step.error_spans} error spans")
    for column in ("type", "tool", "count", "first message"):
        out.add_column(column, justify="right" if column == "count" else "left")
    for group in step.error_groups[:SHOWN]:
        out.add_row(safe_text(group.type), safe_text(group.tool), safe_text(str(group.count)), safe_text(group.first))
    return out


def _running(running: RunningStep, now_ns: int) -> Any:
    done = ", ".join(f"{'  ' * p.depth}{p.name} {p.seconds:.1f} s" for p in running.phases if p.depth == 0)
    since = max(0, now_ns - running.last_end_ns) / _NS
    return safe_text(
        f"training step running {max(0, now_ns - running.start_ns) / _NS:.1f} s; phases ended: {done}; "
        f"{since:.1f} s since the last one ended"
    )


def summary_line(step: StepReport) -> str:
    """One step in one line: the report's heading, reward, zero-advantage groups, stragglers, errors."""
    parts = [step_headline(step)]
    if step.open or step.unfinished_count:
        parts.append(f"{step.open} open, {step.unfinished_count} unfinished")
    parts.append(f"reward mean {number(step.reward_mean)}")
    parts.append(f"{len(step.zero_advantage)} zero-advantage groups")
    parts.append(f"{len(step.stragglers)} stragglers")
    parts.append(f"{step.error_spans} error spans")
    return "; ".join(parts)


def plain_line(snapshot: Snapshot) -> str:
    """The snapshot in one line, for logs (control characters escaped)."""
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.now_ns / _NS))
    step = snapshot.step
    said = summary_line(step) if step is not None else "no session yet"
    hung = f"; {len(snapshot.hung)} open sessions idle > {snapshot.idle_after_s:g} s" if snapshot.hung else ""
    read = f"; {snapshot.spans} spans, {snapshot.bad_lines} bad lines"
    return printable(f"{clock} {said}{hung}{read}")
