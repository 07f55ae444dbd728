"""The ``otlp`` destination: span batches encoded by the package's encoder and posted over OTLP/HTTP.

Configured like OpenTelemetry's ``OTLPSpanExporter`` (the same variables, read into the
``otlp_*`` configuration keys, the same defaults), with three differences: a bad value
raises at start-up instead of being logged and replaced; a batch whose request would
exceed ``max_request_bytes`` is split into several requests instead of being dropped;
and an answer's ``partial_success`` is read: the spans it rejected are left out (failed),
not counted as delivered.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.otlp.encoding import NOT_REPLACED, PerSpan, SpanEncoder, read_partial_success
from verl_otel_bridge._internal.otlp.sender import OtlpHttpSender, OtlpSendError, import_urllib3
from verl_otel_bridge._internal.otlp.settings import DEFAULT_ENDPOINT
from verl_otel_bridge._internal.status import Where
from verl_otel_bridge._internal.vocabulary import Translator

logger = logging.getLogger(__name__)

#: Largest request body, before compression. Collectors refuse larger ones
#: (OpenTelemetry Collector's OTLP/HTTP receiver: 20 MiB; many proxies in front: less).
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024

#: Per-span replacements for a batch (attributes, events, resources), or :data:`NOT_REPLACED`.
Describe = Callable[[Sequence[ReadableSpan]], PerSpan]


class OtlpDestination:
    """Encodes batches with :class:`~verl_otel_bridge._internal.otlp.encoding.SpanEncoder` and posts them.

    One :meth:`send` makes one request, or several when the encoded batch exceeds
    ``max_request_bytes`` (split in halves until each part fits), all within one
    ``timeout_s`` of the sender. A span too large alone, one that cannot be encoded,
    and spans the answer's ``partial_success`` rejected are left out (logged once per
    kind); a request that is not accepted refuses it and every span after it.

    Args:
        sender: where requests go.
        describe: what each span is sent with instead of its own attributes, events and
            resource (the generic vocabulary for ``otlp``; RL-Insight's attributes for its transport).
        resource: the resource every span is sent with, if not its own.
        max_request_bytes: largest request body before compression.
    """

    def __init__(
        self,
        sender: OtlpHttpSender,
        *,
        describe: Describe | None = None,
        resource: Resource | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        if max_request_bytes < 1:
            raise ValueError(f"verl_otel_bridge: max_request_bytes={max_request_bytes!r} must be at least 1")
        self.sender = sender
        self.max_request_bytes = max_request_bytes
        self._describe = describe
        self._resource = resource
        self._last_error: str | None = None
        self._encoder = SpanEncoder()
        self._once = OnceLogger(logger)
        self._rejected: set[int] = set()  # ids of the spans of the request being encoded that were left out

    @property
    def endpoint(self) -> str:
        """The traces URL (secrets masked)."""
        return self.sender.endpoint

    def __repr__(self) -> str:
        return f"OtlpDestination({self.sender!r}, max_request_bytes={self.max_request_bytes})"

    def requests(
        self, spans: Sequence[ReadableSpan], per_span: PerSpan = NOT_REPLACED, start: int = 0
    ) -> Iterator[tuple[int, int, bytes | None]]:
        """``(start, end, body)`` per request for ``spans[start:end]``, in order, each encoded when asked for.

        ``body`` is None for a single span too large for a request. ``start`` is the index of ``spans[0]``
        in the whole batch (the halves of a split).
        """
        body = self._encoder.encode(
            spans,
            resource=self._resource,
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
            yield from self.requests(spans[:half], per_span.part(0, half), start)
            yield from self.requests(spans[half:], per_span.part(half, len(spans)), start + half)

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Post ``spans`` (in as many requests as the size limit needs) within one timeout."""
        return self.send_described(spans, self._describe(spans) if self._describe is not None else NOT_REPLACED)

    def send_described(self, spans: Sequence[ReadableSpan], per_span: PerSpan) -> Outcome:
        """:meth:`send`, each span sent with the attributes, events and resource ``per_span`` gives for it."""
        deadline = time.monotonic() + self.sender.timeout_s
        self._rejected = set()
        done = too_large = rejected = 0  # spans[:done] went out (or were too large to)
        problem: str | None = None
        refused: Sequence[ReadableSpan] = ()
        try:
            for start, end, body in self.requests(spans, per_span):
                if body is None:
                    too_large += 1
                    problem = self._too_large(spans[start])
                    self._once.log("too-large", logging.WARNING, "%s; it is left out", problem)
                else:
                    partial = read_partial_success(self.sender.send(body, deadline=deadline))
                    if partial is not None:
                        count = min(max(partial.rejected_spans, 0), end - start)
                        rejected += count
                        problem = self.sender.scrub(
                            f"{self.endpoint} rejected {count} of {end - start} spans: {partial.error_message!r}"
                        )
                        self._once.log("partial", logging.WARNING, "%s; they are counted as failed", problem)
                done = end
        except OtlpSendError as exc:
            problem, refused = str(exc), spans[done:]
            self._once.log(
                f"failed:{exc.status}", logging.WARNING, "exporting %d spans over OTLP failed: %s", len(refused), exc
            )
        unencodable = sum(1 for span in spans[:done] if id(span) in self._rejected) if self._rejected else 0
        if unencodable and problem is None:
            problem = f"{unencodable} spans could not be encoded for OTLP"
        left_out = too_large + rejected + unencodable
        self._last_error = problem
        return Outcome(done - left_out, left_out, refused, problem)

    def _reject(self, span: ReadableSpan, exc: Exception) -> None:
        self._rejected.add(id(span))
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

    def flush(self, timeout_s: float) -> bool:
        """Nothing is buffered here."""
        return True

    def close(self) -> None:
        """Close the connection; a retry still waiting ends at once."""
        self.sender.close()

    def where(self) -> Where:
        return {"endpoint": self.endpoint, "path": None, "last_error": self._last_error}


def translated(project: str | None) -> Describe:
    """Each span in the generic vocabulary, conversations whole (:meth:`.Translator.batch`); a span it cannot
    translate goes as it is."""
    translate = Translator(project)

    def describe(spans: Sequence[ReadableSpan]) -> PerSpan:
        parts = translate.batch(spans)
        return PerSpan([p["attributes"] for p in parts], [p["events"] for p in parts], [p["resource"] for p in parts])

    return describe


def build(config: BridgeConfig, counts: SpanCounts) -> OtlpDestination:
    """The ``otlp`` destination of ``config``: the generic vocabulary, to ``otlp_endpoint``.

    Raises:
        ConfigError: a bad ``otlp_*`` setting, or urllib3 (the ``otlp`` extra) is missing.
    """
    import_urllib3("exporter 'otlp'", "exporter")
    sender = OtlpHttpSender.of(config.otlp_endpoint or DEFAULT_ENDPOINT, config)
    return OtlpDestination(sender, describe=translated(config.project))


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    """``doctor``'s check: an empty export request to the endpoint, as this destination would send it."""
    from verl_otel_bridge._internal.otlp.check import check_otlp_endpoint

    try:
        import_urllib3("exporter 'otlp'", "exporter")
        endpoint = config.otlp_endpoint or DEFAULT_ENDPOINT
        return check_otlp_endpoint(endpoint, config, environ or os.environ, timeout_s)
    except ValueError as exc:
        return {"ok": False, "detail": str(exc)}
