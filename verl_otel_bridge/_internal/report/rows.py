"""Display strings for steps and sessions, shared by the terminal and HTML views."""

from __future__ import annotations

from verl_otel_bridge._internal.report.aggregate import Report, SessionSummary, StepReport, ZeroAdvantageGroup
from verl_otel_bridge._internal.report.values import step_label
from verl_otel_bridge._internal.stragglers import StragglerRule


def seconds(value: float | None) -> str:
    """``1.234 s``, ``-`` for None."""
    return "-" if value is None else f"{value:.3f} s"


def number(value: float | None, digits: int = 3) -> str:
    """A float with ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


#: Zero-advantage groups named per step (all are counted).
LISTED = 10

#: Step-table columns a terminal shows (the HTML view shows every column of :func:`step_rows`).
STEP_COLUMNS = (
    "step",
    "sessions",
    "done",
    "unfin.",
    "hung",
    "err",
    "p50 s",
    "p90 s",
    "max s",
    "0-adv",
    "reward",
    "r(dur)",
)


def step_rows(report: Report) -> list[dict[str, str]]:
    """The step table, one dict of display strings per step (shared by the text and HTML views)."""
    return [
        {
            "step": step_label(s.step),
            "sessions": str(s.sessions),
            "done": str(s.finished),
            "unfin.": str(s.unfinished_count),
            "hung": str(s.hung_count),
            "partial": str(s.partial),
            "err": str(s.error_spans),
            "p50 s": number(s.p50_s),
            "p90 s": number(s.p90_s),
            "max s": number(s.max_s),
            "0-adv": str(len(s.zero_advantage)),
            "reward": number(s.reward_mean),
            "r(dur)": number(s.reward_vs_duration, 2),
            "r(turns)": number(s.reward_vs_turns, 2),
            "slowest session": s.slowest[0].state_lane_id if s.slowest else "-",
        }
        for s in report.steps
    ]


def step_headline(step: StepReport) -> str:
    """A step's sessions and durations in one line (the text report's heading, ``watch``'s summary)."""
    return (
        f"step {step_label(step.step)}: {step.sessions} sessions, {step.finished} finished; duration p50 "
        f"{seconds(step.p50_s)}, p90 {seconds(step.p90_s)}, max {seconds(step.max_s)}"
    )


def reward_text(step: StepReport) -> str:
    """A step's rewards: the mean and how they go with duration and turns."""
    return (
        f"reward: mean {number(step.reward_mean)} over {step.rewarded} sessions; "
        f"r(reward, duration) = {number(step.reward_vs_duration, 2)}, "
        f"r(reward, turns) = {number(step.reward_vs_turns, 2)}"
    )


def zero_advantage_text(group: ZeroAdvantageGroup) -> str:
    """One zero-advantage group in words."""
    return f"uid {group.uid!r}: all {group.sessions} sessions got reward {group.reward:g}"


def straggler_text(step: StepReport, s: SessionSummary) -> str:
    """One straggler of ``step`` in words (the text report, the HTML page and ``watch`` say it alike)."""
    ratio = s.duration_s / step.p50_s if step.p50_s else float("inf")
    return (
        f"uid {s.uid!r} sample {s.sample} session {s.session}: {s.duration_s:.3f} s, {ratio:.0f} x the median "
        f"(generate {s.generate_s:.3f} s, tool {s.tool_s:.3f} s)"
    )


def rule_text(rule: StragglerRule) -> str:
    """The straggler rule as the views state it."""
    return f"a straggler is a finished session {rule.describe()}"


def session_row(s: SessionSummary) -> dict[str, str]:
    """One session's display strings (shared by the text and HTML views)."""
    return {
        "uid": s.uid,
        "sample": s.sample,
        "session": s.session,
        "dur s": number(s.duration_s),
        "turns": str(s.turns),
        "gen s": number(s.generate_s),
        "tool s": number(s.tool_s),
        "ctx tok": str(s.context_tokens),
        "gen tok": str(s.generated_tokens),
        "reward": number(s.reward),
        "server": s.server or "-",
        "status": s.status or s.kind,
        "last span": s.last_span or "-",
        "errors": str(s.errors),
        "first error": s.error or "-",
    }


SLOWEST_COLUMNS = (
    "uid",
    "sample",
    "session",
    "dur s",
    "turns",
    "gen s",
    "tool s",
    "ctx tok",
    "gen tok",
    "reward",
    "server",
)
#: What the session columns count, said under the tables (text and HTML) and in docs/cli.md.
SESSION_COLUMNS_NOTE = (
    "turns: verl's num_turns when the session records it, else its turn spans; "
    "ctx tok: the final context (the largest prompt + completion of one generate turn); "
    "gen tok: completion tokens of all its generate turns"
)
OPEN_COLUMNS = ("uid", "sample", "session", "status", "dur s", "turns", "last span")
ERROR_COLUMNS = ("uid", "sample", "session", "errors", "first error")


def skipped_lines(report: Report, shown: int = 5) -> list[str]:
    """The files the report skipped, as ``skipped PATH: why`` lines (the first ``shown``, then how many more)."""
    lines = [f"skipped {path}: {why}" for path, why in report.skipped[:shown]]
    if report.skipped_count > len(lines):
        lines.append(f"... and {report.skipped_count - len(lines)} more skipped")
    return lines
