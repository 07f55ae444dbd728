"""A :class:`~verl_otel_bridge.report.Report` as one self-contained HTML file."""

from verl_otel_bridge._internal.report.html import render_html

__all__ = ["render_html"]
