"""One span as an OTLP/HTTP receiver decodes it, for every loopback receiver of the tests."""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as decoded from an OTLP ``ExportTraceServiceRequest``.

    Ids are lowercase hex; ``parent_span_id`` is ``None`` for a root span.
    ``attributes`` and ``resource`` hold plain Python values (str, int, float,
    bool, bytes, lists of them, dicts for key-value lists). ``received_ns`` is
    ``time.perf_counter_ns()`` when the request carrying the span had been read
    (0 when decoded elsewhere); it takes no part in comparisons.
    """

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_time_ns: int
    end_time_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)
    received_ns: int = field(default=0, compare=False)


def _any_value(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` message to a Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _key_values(value.kvlist_value.values)
    return getattr(value, kind)


def _key_values(items: Any) -> dict[str, Any]:
    """Convert repeated OTLP ``KeyValue`` messages to a dict."""
    return {item.key: _any_value(item.value) for item in items}


def decode_export_request(body: bytes, content_encoding: str = "", received_ns: int = 0) -> list[ReceivedSpan]:
    """Decode an OTLP/HTTP protobuf trace export body (optionally gzip/deflate)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    encoding = content_encoding.strip().lower()
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    elif encoding not in ("", "identity"):
        raise ValueError(f"unsupported Content-Encoding {content_encoding!r}")
    request = ExportTraceServiceRequest.FromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _key_values(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        start_time_ns=int(span.start_time_unix_nano),
                        end_time_ns=int(span.end_time_unix_nano),
                        attributes=_key_values(span.attributes),
                        status_code=int(span.status.code),
                        status_message=span.status.message,
                        resource=resource,
                        received_ns=received_ns,
                    )
                )
    return spans
