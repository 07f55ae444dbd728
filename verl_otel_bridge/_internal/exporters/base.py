"""The base of every exporter that wraps another one, and how an exporter reports where it sends.

An exporter that sends somewhere may have two attributes: ``endpoint`` (its URL)
and ``last_error`` (why its last export failed, e.g. the HTTP status and the start
of the answer; None after a success). Wrappers pass both through;
:func:`exporter_report` reads them from any exporter, for ``status()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.status import Endpoint

logger = logging.getLogger(__name__)


class LeavesOut(Protocol):
    """An exporter that can send a batch while leaving some of its spans out (e.g. one it cannot encode)."""

    def take_left_out(self) -> int:
        """How many spans of the last ``export`` were left out while the rest were sent; resets to 0."""
        ...


def left_out_reader(exporter: SpanExporter) -> Callable[[], int]:
    """``exporter``'s :meth:`LeavesOut.take_left_out`, or one that says 0 for exporters that send all or nothing.

    Looked up once, when a wrapper is made: a protocol check per batch would cost
    more than the batch itself for the inline ``memory`` and ``none`` exporters.
    """
    take: Callable[[], int] | None = getattr(exporter, "take_left_out", None)
    return take if callable(take) else _nothing_left_out


def _nothing_left_out() -> int:
    return 0


def exporter_report(exporter: SpanExporter) -> Endpoint:
    """``{"endpoint", "last_error"}`` of ``exporter`` (None where it does not say)."""
    endpoint = getattr(exporter, "endpoint", None)
    error = getattr(exporter, "last_error", None)
    return {
        "endpoint": endpoint if isinstance(endpoint, str) else None,
        "last_error": error if isinstance(error, str) else None,
    }


def export_guarded(exporter: SpanExporter, spans: Sequence[ReadableSpan], name: str) -> SpanExportResult:
    """``exporter.export(spans)``; an exception is logged (as exporter ``name``'s) and becomes ``FAILURE``."""
    try:
        return exporter.export(spans)
    except Exception:
        logger.exception("the %s exporter raised on %d spans", name, len(spans))
        return SpanExportResult.FAILURE


class WrappingSpanExporter(SpanExporter):
    """Holds ``inner`` and forwards ``force_flush`` and ``shutdown`` to it; subclasses override ``export``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    @property
    def endpoint(self) -> str | None:
        """The inner exporter's endpoint, if it has one."""
        return exporter_report(self.inner)["endpoint"]

    @property
    def last_error(self) -> str | None:
        """The inner exporter's last error, if it reports one."""
        return exporter_report(self.inner)["last_error"]

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
