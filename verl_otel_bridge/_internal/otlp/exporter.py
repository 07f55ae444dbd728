"""An OpenTelemetry ``SpanExporter`` over OTLP/HTTP: the package's encoder and sender.

Configured like OpenTelemetry's ``OTLPSpanExporter`` (same variables, same
defaults), with two differences: a bad value raises at construction instead of
being logged and replaced, and a batch whose request would exceed
``max_request_bytes`` is split into several requests instead of being dropped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.otlp.encoding import NOT_REPLACED, PerSpan, SpanEncoder
from verl_otel_bridge._internal.otlp.sender import OtlpHttpSender, OtlpSendError
from verl_otel_bridge._internal.otlp.settings import check_protocol, traces_endpoint

logger = logging.getLogger(__name__)

#: Largest request body, before compression. Collectors refuse larger ones
#: (OpenTelemetry Collector's OTLP/HTTP receiver: 20 MiB; many proxies in front: less).
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


class OtlpSpanExporter(SpanExporter):
    """Encodes span batches with :class:`~verl_otel_bridge._internal.otlp.encoding.SpanEncoder` and posts them.

    One ``export`` call sends one request, or several when the encoded batch
    exceeds ``max_request_bytes`` (split in halves until each part fits); all of
    them within one ``timeout_s`` of the sender. A span too large alone, or one
    that cannot be encoded, is left out and logged (once per kind) while the rest
    are sent: the call returns ``SUCCESS`` and :meth:`take_left_out` says how many
    were left out. ``FAILURE`` means a request was not accepted. Never raises.

    Args:
        sender: where requests go.
        max_request_bytes: largest request body before compression.
    """

    def __init__(self, sender: OtlpHttpSender, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if max_request_bytes < 1:
            raise ValueError(f"verl_otel_bridge: max_request_bytes={max_request_bytes!r} must be at least 1")
        self.sender = sender
        self.max_request_bytes = max_request_bytes
        #: Why the last ``export`` failed (the sender's error: status and start of the answer); None after a success.
        self.last_error: str | None = None
        self._encoder = SpanEncoder()
        self._once = OnceLogger(logger)
        self._left_out: set[int] = set()  # ids of the last batch's spans that were not sent

    @property
    def endpoint(self) -> str:
        """The traces URL (credentials masked)."""
        return self.sender.endpoint

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        endpoint: str | None = None,
        endpoint_name: str = "otlp_endpoint",
    ) -> OtlpSpanExporter:
        """An exporter configured as OpenTelemetry's ``OTLPSpanExporter`` would be from ``environ``.

        Args:
            environ: where the ``OTEL_EXPORTER_OTLP_*`` variables are read (default ``os.environ``).
            endpoint: the traces URL, used as it is (default: from ``environ``, see
                :func:`~verl_otel_bridge._internal.otlp.settings.traces_endpoint`).
            endpoint_name: what ``endpoint`` is called in error messages.

        Raises:
            ValueError: a bad value (naming its variable), or urllib3 is missing.
        """
        env = os.environ if environ is None else environ
        check_protocol(env)
        url, _ = traces_endpoint(env, endpoint, endpoint_name)
        return cls(OtlpHttpSender.from_environment(url, env))

    def __repr__(self) -> str:
        return f"OtlpSpanExporter({self.sender!r}, max_request_bytes={self.max_request_bytes})"

    def requests(
        self, spans: Sequence[ReadableSpan], *, resource: Resource | None = None, per_span: PerSpan = NOT_REPLACED
    ) -> Iterator[tuple[int, int, bytes | None]]:
        """``(start, end, body)`` per request for ``spans[start:end]``, in order, each encoded when asked for.

        ``body`` is None for a single span too large for a request. ``resource`` and ``per_span``'s
        replacements are as :meth:`SpanEncoder.encode` takes them.
        """
        yield from self._split(spans, 0, resource, per_span)

    def _split(
        self, spans: Sequence[ReadableSpan], start: int, resource: Resource | None, per_span: PerSpan
    ) -> Iterator[tuple[int, int, bytes | None]]:
        body = self._encoder.encode(
            spans,
            resource=resource,
            attributes=per_span.attributes,
            events=per_span.events,
            resources=per_span.resources,
            on_reject=self._reject,
        )
        if len(body) <= self.max_request_bytes:
            yield start, start + len(spans), body
        elif len(spans) == 1:
            yield start, start + 1, None
        else:
            half = len(spans) // 2
            yield from self._split(spans[:half], start, resource, per_span.part(0, half))
            yield from self._split(spans[half:], start + half, resource, per_span.part(half, len(spans)))

    def deliver(
        self,
        spans: Sequence[ReadableSpan],
        *,
        resource: Resource | None = None,
        attributes: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Send ``spans`` (in as many requests as the size limit needs) within one timeout.

        Raises:
            OtlpSendError: a request was not accepted, or a span is too large alone;
                its ``delivered`` says how many leading spans were sent before.
        """
        deadline = time.monotonic() + self.sender.timeout_s
        for start, _end, body in self.requests(spans, resource=resource, per_span=PerSpan(attributes, None, None)):
            try:
                if body is None:
                    raise OtlpSendError(self._too_large(spans[start]))
                self.sender.send(body, deadline=deadline)
            except OtlpSendError as exc:
                exc.delivered = start
                raise

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send ``spans``; ``FAILURE`` if a request was not accepted (the reason is logged once per kind)."""
        return self.export_translated(spans)

    def export_translated(self, spans: Sequence[ReadableSpan], per_span: PerSpan = NOT_REPLACED) -> SpanExportResult:
        """:meth:`export`, each span sent with the attributes, events and resource ``per_span`` gives for it:
        how a translating wrapper hands its work over without copying the spans."""
        deadline = time.monotonic() + self.sender.timeout_s
        self._left_out = set()
        try:
            for start, _end, body in self.requests(spans, per_span=per_span):
                if body is None:
                    self._left_out.add(id(spans[start]))
                    self.last_error = self._too_large(spans[start])
                    self._once.log("too-large", logging.WARNING, "%s; it is left out", self.last_error)
                    continue
                self.sender.send(body, deadline=deadline)
        except OtlpSendError as exc:
            self._left_out = set()
            self.last_error = str(exc)
            self._once.log(
                f"failed:{exc.status}", logging.WARNING, "exporting %d spans over OTLP failed: %s", len(spans), exc
            )
            return SpanExportResult.FAILURE
        if not self._left_out:
            self.last_error = None
        return SpanExportResult.SUCCESS

    def take_left_out(self) -> int:
        """How many spans of the last :meth:`export` were left out while the rest were sent; resets to 0."""
        count, self._left_out = len(self._left_out), set()
        return count

    def _reject(self, span: ReadableSpan, exc: Exception) -> None:
        self._left_out.add(id(span))
        self._once.log(
            f"unencodable:{type(exc).__name__}",
            logging.WARNING,
            "span %r cannot be encoded for OTLP (%s: %s); it is left out, the rest of its batch is sent",
            span.name,
            type(exc).__name__,
            exc,
        )

    def _too_large(self, span: ReadableSpan) -> str:
        size = len(self._encoder.encode([span]))
        return (
            f"span {span.name!r} alone encodes to {size} bytes, over the {self.max_request_bytes}-byte request limit "
            "(lower max_attribute_length, or record fewer events)"
        )

    def shutdown(self) -> None:
        """Close the connection; a retry still waiting ends at once."""
        self.sender.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here."""
        return True
