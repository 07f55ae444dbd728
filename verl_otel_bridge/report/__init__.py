"""Answers from JSONL captures: per-step stragglers, hung sessions, errors and rewards.

:func:`build_report` streams captures into a :class:`Report` (no rendering, no
dependencies beyond the package); the ``report`` command renders it for a terminal
(the ``cli`` extra's ``rich``) and :func:`verl_otel_bridge.report.html.render_html`
as one self-contained HTML file.
"""

from verl_otel_bridge._internal.report.aggregate import Report, SessionSummary, StepReport, build_report

__all__ = ["Report", "SessionSummary", "StepReport", "build_report"]
