"""A plain, JSON-ready record of a finished span (the JSONL and console format).

One record per line::

    {"name": "agent_session", "trace_id": "<32 hex>", "span_id": "<16 hex>",
     "parent_span_id": "<16 hex>" | null, "start_time_ns": int, "end_time_ns": int,
     "kind": "INTERNAL", "status": {"code": "UNSET"|"OK"|"ERROR", "description": str|null},
     "attributes": {...}, "events": [{"name", "time_ns", "attributes"}],
     "resource": {...}, "scope": "verl_otel_bridge"}

Times are integer nanoseconds since the epoch, so nothing is lost to rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def span_to_record(span: ReadableSpan) -> dict[str, Any]:
    """Describe ``span`` as a JSON-ready dict."""
    context = span.get_span_context()
    parent = span.parent
    status = span.status
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x") if context else None,
        "span_id": format(context.span_id, "016x") if context else None,
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "start_time_ns": span.start_time,
        "end_time_ns": span.end_time,
        "kind": span.kind.name,
        "status": {"code": status.status_code.name, "description": status.description},
        "attributes": _plain(span.attributes),
        "events": [
            {"name": event.name, "time_ns": event.timestamp, "attributes": _plain(event.attributes)}
            for event in span.events
        ],
        "resource": _plain(span.resource.attributes) if span.resource is not None else {},
        "scope": span.instrumentation_scope.name if span.instrumentation_scope is not None else None,
    }


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    if not attributes:
        return {}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in attributes.items()}
