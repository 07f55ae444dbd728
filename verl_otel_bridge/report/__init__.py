"""Answers from JSONL captures: per-step stragglers, hung sessions, errors and rewards.

:mod:`~verl_otel_bridge.report.aggregate` streams captures into a :class:`Report`
(no rendering, no dependencies beyond the package); :mod:`~verl_otel_bridge.report.text`
renders it for a terminal (the ``cli`` extra's ``rich``) and
:mod:`~verl_otel_bridge.report.html` as one self-contained HTML file.
"""

from verl_otel_bridge.report.aggregate import Report, SessionSummary, StepReport, build_report

__all__ = ["Report", "SessionSummary", "StepReport", "build_report"]
