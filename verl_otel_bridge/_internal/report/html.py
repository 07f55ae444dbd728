"""A :class:`~verl_otel_bridge._internal.report.aggregate.Report` as one self-contained HTML file.

Hand-written inline SVG and a few lines of script, no plotting library: the
three views (a table, a waterfall of bars, a scatter plot) need no more, the file
stays small (tens of kB rather than the ~3.5 MB plotly.js would inline) and
opens offline in any browser. Each chart also reads without script: bars and
points carry ``<title>`` tooltips; the script only adds a step filter.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

from verl_otel_bridge._internal.protocol import FAILED_STATUSES
from verl_otel_bridge._internal.report.aggregate import Report, SessionSummary, StepReport
from verl_otel_bridge._internal.report.phases import StepPhases, phase_rows
from verl_otel_bridge._internal.report.rows import (
    ERROR_COLUMNS,
    LISTED,
    OPEN_COLUMNS,
    SESSION_COLUMNS_NOTE,
    SLOWEST_COLUMNS,
    reward_text,
    rule_text,
    seconds,
    session_row,
    skipped_lines,
    step_rows,
    straggler_text,
    zero_advantage_text,
)
from verl_otel_bridge._internal.report.values import step_label
from verl_otel_bridge._internal.stragglers import StragglerRule
from verl_otel_bridge._version import __version__

#: Bar colours by turn type (other types and plain spans get the last).
COLOURS = {"generate": "#4C78A8", "tool": "#F58518", "span": "#9D9D9D"}
_OTHER_COLOUR = "#54A24B"
#: How the waterfall and the scatter mark a session, the strongest first: name -> (colour, what it means).
MARKS = {
    "straggler": ("#d62728", "a straggler: {rule}"),
    "error": ("#7b3294", "an error span, or a failed status"),
    "hung": ("#e6a700", "progress records but no session span: open when the capture ends"),
    "unfinished": ("#8c564b", "still open at shutdown, ended by the bridge"),
}
_POINT_COLOUR = "#4C78A8"

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; max-width: 100%; }
pre.text { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 20em; overflow-y: auto; background: #f6f6f6; }
table.steps { font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; } td.l { overflow-wrap: anywhere; }
svg { max-width: 100%; height: auto; }
section { border-top: 2px solid #ddd; margin-top: 1.5em; }
.note { color: #555; } .warn { color: #b00; }
svg text { font: 11px system-ui, sans-serif; fill: #222; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
.legend span.mark { background: none; border: 3px solid; width: 8px; height: 8px; }
.legend span.ring { background: #fff; border: 2px solid; border-radius: 50%; width: 8px; height: 8px; }
table.phases td.l { white-space: pre; }
"""

_SCRIPT = """
(function () {
  var select = document.getElementById("step-filter");
  var sections = Array.prototype.slice.call(document.querySelectorAll("section[data-step]"));
  select.addEventListener("change", function () {
    sections.forEach(function (s) {
      s.hidden = select.value !== "all" && s.getAttribute("data-step") !== select.value;
    });
  });
  document.body.setAttribute("data-ready", String(sections.length));
})();
"""

_LEFT = ("step", "slowest session", "uid", "last span", "first error", "server", "status", "phase", "metric")


def render_html(report: Report) -> str:
    """The whole report as one HTML document (no external resources)."""
    e = html.escape
    options = "".join(f'<option value="{e(str(s.step))}">step {e(step_label(s.step))}</option>' for s in report.steps)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>verl-otel-bridge report: {len(report.steps)} steps</title><style>{_STYLE}</style></head>",
        "<body><h1>verl-otel-bridge report</h1>",
        f'<p class="note">{report.spans} spans in sessions from {len(report.files)} files '
        f"({e(_some(report.files))}); {report.outside_sessions} spans outside sessions; "
        f"{report.bad_lines} bad lines. verl-otel-bridge {e(__version__)}.</p>",
        *(f'<p class="note">{e(line)}</p>' for line in skipped_lines(report)),
        "<h2>Steps</h2>",
        _table(step_rows(report), "steps"),
        f'<p class="note">{e(rule_text(report.rule))}.</p>',
        '<p><label>Show <select id="step-filter"><option value="all">all steps</option>',
        f"{options}</select></label></p>",
    ]
    parts.extend(_step(step) for step in report.steps)
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def _conversation(s: SessionSummary) -> str:
    e = html.escape
    return (
        f"<details><summary>conversation of sample {e(s.sample)} session {e(s.session)}</summary>"
        f'<p class="note">first input</p><pre class="text">{e(s.input or "-")}</pre>'
        f'<p class="note">last output</p><pre class="text">{e(s.output or "-")}</pre></details>'
    )


def _some(files: list[str], shown: int = 10) -> str:
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(files[:shown]) + more


def _step(step: StepReport) -> str:
    e = html.escape
    out = [
        f'<section data-step="{e(str(step.step))}" id="step-{e(str(step.step))}">',
        f"<h2>Step {e(step_label(step.step))}</h2>",
        f"<p>{step.sessions} sessions, {step.finished} finished; duration p50 {seconds(step.p50_s)}, "
        f"p90 {seconds(step.p90_s)}, max {seconds(step.max_s)}; {step.error_spans} error spans.</p>",
    ]
    if step.trainer is not None:
        out.append(_trainer(step.trainer))
    for s in step.stragglers:
        out.append(
            f'<p class="warn straggler" data-lane="{e(s.state_lane_id)}">Straggler: {e(straggler_text(step, s))}.</p>'
        )
    for group in step.zero_advantage[:LISTED]:
        out.append(f'<p class="warn">Zero advantage: {e(zero_advantage_text(group))}.</p>')
    if len(step.zero_advantage) > LISTED:
        out.append(f'<p class="warn">... and {len(step.zero_advantage) - LISTED} more zero-advantage groups.</p>')
    if step.slowest:
        out += [
            "<h3>Slowest sessions</h3>",
            _sessions(step.slowest, SLOWEST_COLUMNS, "slowest"),
            f'<p class="note">{e(SESSION_COLUMNS_NOTE)}.</p>',
        ]
        out += [_conversation(s) for s in step.slowest if s.input or s.output]
    if step.unfinished:
        out += ["<h3>Unfinished at shutdown</h3>", _sessions(step.unfinished, OPEN_COLUMNS, "unfinished")]
    if step.hung:
        out += ["<h3>Hung: progress records, no session span</h3>", _sessions(step.hung, OPEN_COLUMNS, "hung")]
    if step.partial:
        out.append(f'<p class="note">{step.partial} sessions with some spans but no session span or progress.</p>')
    if step.errored:
        out += ["<h3>Errors</h3>", _sessions(step.errored, ERROR_COLUMNS, "errors")]
    shown = [*step.slowest, *step.unfinished, *step.hung]
    listed = {s.state_lane_id for s in shown}
    shown += [s for s in step.errored if s.state_lane_id not in listed]  # their bar only: turns are not kept
    if shown:
        stragglers = {s.state_lane_id for s in step.stragglers}
        out += [
            "<h3>Waterfall: turns and tools on a time axis from each session's start</h3>",
            _waterfall(shown, stragglers, step.rule),
        ]
    if step.points:
        out += [
            f"<h3>Reward vs duration</h3><p>{e(reward_text(step))}</p>",
            _scatter(step),
        ]
    out.append("</section>")
    return "\n".join(out)


def _table(rows: Sequence[dict[str, str]], name: str) -> str:
    if not rows:
        return '<p class="note">nothing</p>'
    e = html.escape
    columns = list(rows[0])
    head = "".join(f'<th class="{"l" if c in _LEFT else ""}">{e(c)}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in _LEFT else ""}">{e(row[c])}</td>' for c in columns) + "</tr>"
        for row in rows
    )
    return f'<table class="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _sessions(sessions: Iterable[SessionSummary], columns: Sequence[str], name: str) -> str:
    return _table([{c: session_row(s)[c] for c in columns} for s in sessions], name)


def marks_of(s: SessionSummary, stragglers: set[str]) -> list[str]:
    """What the charts mark ``s`` as (names of :data:`MARKS`, in that order); empty for an ordinary session."""
    failed = s.errors > 0 or s.status.lower() in FAILED_STATUSES
    flags = {
        "straggler": s.state_lane_id in stragglers,
        "error": failed,
        "hung": s.kind == "hung",
        "unfinished": s.kind == "unfinished",
    }
    return [name for name in MARKS if flags[name]]


def _legend(items: Iterable[str]) -> str:
    return f'<div class="legend">{"".join(items)}</div>'


def _mark_legend(names: Iterable[str], rule: StragglerRule, css: str = "mark") -> list[str]:
    e = html.escape
    meanings = {n: MARKS[n][1].format(rule=rule.describe()) for n in names}
    return [
        f'<span class="{css}" style="border-color:{MARKS[n][0]}" title="{e(meaning)}"></span>{e(n)} '
        f'<small class="note">({e(meaning)})</small>'
        for n, meaning in meanings.items()
    ]


def _time_axis(css: str, ticks: list[float], label_w: int, plot_w: int, top: int, height: int) -> list[str]:
    """The opening ``<svg>`` of a chart of rows: labels ``label_w`` wide, then seconds across ``plot_w`` (the
    last tick at its right edge), a grid line down the chart and a label above it per tick."""
    scale = plot_w / ticks[-1]
    width = label_w + plot_w + 20
    out = [f'<svg class="{css}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    for tick in ticks:
        x = label_w + tick * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle">{tick:g} s</text>')
    return out


def _waterfall(sessions: Sequence[SessionSummary], stragglers: set[str], rule: StragglerRule) -> str:
    e = html.escape
    label_w, plot_w, row_h, top = 300, 640, 22, 24
    ticks = nice_ticks(0.0, max((s.duration_s for s in sessions), default=0.0) or 1e-3)
    scale = plot_w / ticks[-1]
    out = _time_axis("waterfall", ticks, label_w, plot_w, top, top + row_h * len(sessions) + 8)
    seen: set[str] = set()
    for row, s in enumerate(sessions):
        y = top + row * row_h
        lane = e(s.state_lane_id)
        label = f"uid {s.uid} sample {s.sample} session {s.session}"
        marks = marks_of(s, stragglers)
        seen.update(marks)
        first = s.status or s.kind
        status = ", ".join([first, *(m for m in marks if m != first)])
        out.append(f'<g class="session" data-lane="{lane}" data-kind="{e(s.kind)}" data-marks="{" ".join(marks)}">')
        if marks:
            colour = MARKS[marks[0]][0]
            out.append(f'<rect class="mark" x="2" y="{y + 5}" width="10" height="{row_h - 10}" fill="{colour}"/>')
        out.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{e(label)} [{e(status)}]</text>')
        bar = max(1.0, s.duration_s * scale)
        stroke = f'stroke="{MARKS[marks[0]][0]}" stroke-width="2"' if marks else 'stroke="#9fb3c8"'
        out.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{bar:.1f}" height="{row_h - 4}" fill="#eef2f7" '
            f"{stroke}><title>{lane}: {s.duration_s:.3f} s, {s.turns} turns, {e(status)}</title></rect>"
        )
        for segment in s.segments:
            x = label_w + max(0.0, (segment.start_ns - s.start_ns) / 1e9) * scale
            w = max(1.0, (segment.end_ns - segment.start_ns) / 1e9 * scale)
            inset = 5 if segment.kind in ("generate", "tool") else 8
            colour = COLOURS.get(segment.kind, _OTHER_COLOUR)
            seconds_ = (segment.end_ns - segment.start_ns) / 1e9
            out.append(
                f'<rect class="segment" x="{x:.1f}" y="{y + inset}" width="{w:.1f}" height="{row_h - 2 * inset}" '
                f'fill="{colour}"><title>{e(segment.label)}: {seconds_:.3f} s</title></rect>'
            )
        out.append("</g>")
    out.append("</svg>")
    legend = [f'<span style="background:{c}"></span>{e(k)}' for k, c in COLOURS.items()]
    legend.append(f'<span style="background:{_OTHER_COLOUR}"></span>other')
    legend += _mark_legend((name for name in MARKS if name in seen), rule)
    return "\n".join(out) + _legend(legend)


def _scatter(step: StepReport) -> str:
    e = html.escape
    width, height, left, bottom, pad = 520, 300, 56, 36, 12
    points = step.points
    stragglers = {s.state_lane_id for s in step.stragglers}
    x_ticks = nice_ticks(0.0, max(d for d, *_ in points) or 1e-3)
    rewards = [r for _, r, _, _ in points]
    low, high = min(rewards), max(rewards)
    if high == low:
        low, high = low - 0.5, high + 0.5
    y_ticks = nice_ticks(low, high)
    x_max, y_min, y_max = x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - pad, height - bottom - pad

    def sx(value: float) -> float:
        return left + value / x_max * plot_w

    def sy(value: float) -> float:
        return pad + (y_max - value) / (y_max - y_min) * plot_h

    out = [f'<svg class="scatter" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    for tick in y_ticks:
        out.append(f'<line x1="{left}" y1="{sy(tick):.1f}" x2="{left + plot_w}" y2="{sy(tick):.1f}" stroke="#eee"/>')
        out.append(f'<text class="y-tick" x="{left - 6}" y="{sy(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
    out.append(f'<rect x="{left}" y="{pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    for tick in x_ticks:
        x = sx(tick)
        out.append(f'<text class="x-tick" x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">{tick:g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">session duration (s)</text>')
    out.append(f'<text x="12" y="{pad + plot_h / 2}" transform="rotate(-90 12 {pad + plot_h / 2})">reward</text>')
    seen: set[str] = set()
    for duration, reward, turns, lane in points:
        straggler, failed = lane in stragglers, lane in step.point_errors
        marks = [name for name, on in (("straggler", straggler), ("error", failed)) if on]
        seen.update(marks)
        colour = MARKS["straggler"][0] if straggler else _POINT_COLOUR
        ring = f' stroke="{MARKS["error"][0]}" stroke-width="2"' if failed else ""
        said = f", {' and '.join(marks)}" if marks else ""
        out.append(
            f'<circle cx="{sx(duration):.1f}" cy="{sy(reward):.1f}" r="{5 if marks else 3}" fill="{colour}" '
            f'fill-opacity="0.75"{ring} data-marks="{" ".join(marks)}">'
            f"<title>{e(lane)}: {duration:.3f} s, reward {reward:g}, {turns} turns{said}</title></circle>"
        )
    out.append("</svg>")
    legend = [f'<span style="background:{_POINT_COLOUR}"></span>finished session']
    if "straggler" in seen:
        legend += _mark_legend(["straggler"], step.rule)
    if "error" in seen:
        legend += _mark_legend(["error"], step.rule, "ring")
    legend.append('<small class="note">(hung and unfinished sessions have no reward: see the waterfall)</small>')
    return "\n".join(out) + _legend(legend)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round ticks (1, 2 or 5 times a power of ten apart) from at or below ``low``
    to at or above ``high``: the axis runs from the first to the last."""
    raw = (high - low) / count if high > low else abs(high) / count or 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    first = math.floor(low / step + 1e-9)
    last = max(first + 1, math.ceil(high / step - 1e-9))
    return [round(i * step, 10) for i in range(first, last + 1)]


# --------------------------------------------------------------------------- the trainer's step
# A training step (verl_otel_bridge._internal.verl.trainer) as a timeline: the step, each phase indented by
# its nesting, and under each phase the sessions that ran in it (``gen``'s rollouts).

#: Session rows drawn under a phase (all are counted).
TIMELINE_SESSIONS = 40
PHASE_COLOURS = {"training_step": "#9D9D9D", "phase": "#4C78A8", "session": "#F58518", "error": "#D62728"}


def _trainer(trainer: StepPhases) -> str:
    e = html.escape
    error = ' <span class="warn">(ended with an error)</span>' if trainer.error else ""
    out = [
        f'<div class="trainer" data-step="{e(str(trainer.step))}">',
        f"<h3>Training step: {seconds(trainer.seconds)}{error}</h3>",
        _table(phase_rows(trainer), "phases"),
        _timeline(trainer),
    ]
    if trainer.metrics:
        rows = [{"metric": key, "value": str(value)} for key, value in sorted(trainer.metrics.items())]
        out.append(
            f'<details class="metrics"><summary>{len(rows)} metrics verl logged for this step</summary>'
            f"{_table(rows, 'metrics')}</details>"
        )
    out.append("</div>")
    return "\n".join(out)


def _timeline(trainer: StepPhases) -> str:
    e = html.escape
    label_w, plot_w, row_h, top = 330, 610, 20, 24
    ticks = nice_ticks(0.0, trainer.seconds or 1e-3)
    scale = plot_w / ticks[-1]
    # (colour key, indent, label, start, end, css class, data value)
    rows: list[tuple[str, int, str, int, int, str, str]] = [
        ("training_step", 0, f"training_step {trainer.step}", trainer.start_ns, trainer.end_ns, "training_step", "")
    ]
    cut = trainer.sessions_cut
    for phase in trainer.phases:
        kind = "error" if phase.error else "phase"
        rows.append((kind, phase.depth + 1, phase.name, phase.start_ns, phase.end_ns, "phase", phase.name))
        under = trainer.sessions_under(phase.name)
        cut += max(0, len(under) - TIMELINE_SESSIONS)
        for session in under[:TIMELINE_SESSIONS]:
            kind = "error" if session.status in ("error", "cancelled", "unfinished") else "session"
            lane = session.state_lane_id
            rows.append((kind, phase.depth + 2, lane, session.start_ns, session.end_ns, "timeline-session", lane))
    out = _time_axis("timeline", ticks, label_w, plot_w, top, top + row_h * len(rows) + 8)
    for row, (kind, indent, label, start, end, css, data) in enumerate(rows):
        y = top + row * row_h
        x = label_w + max(0.0, (start - trainer.start_ns) / 1e9) * scale
        width = max(1.0, (end - start) / 1e9 * scale)
        attribute = "data-lane" if css == "timeline-session" else "data-phase"
        out.append(f'<g class="{css}" {attribute}="{e(data)}">')
        out.append(
            f'<text x="{4 + 14 * indent}" y="{y + 14}">{e(label)}</text>'
            f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="{row_h - 6}" fill="{PHASE_COLOURS[kind]}">'
            f"<title>{e(label)}: {(end - start) / 1e9:.3f} s</title></rect></g>"
        )
    out.append("</svg>")
    legend = "".join(f'<span style="background:{c}"></span>{e(k)}' for k, c in PHASE_COLOURS.items())
    more = f'<p class="note">... and {cut} more sessions, not drawn.</p>' if cut else ""
    return "\n".join(out) + f'<div class="legend">{legend}</div>{more}'
