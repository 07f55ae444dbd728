"""A plain, JSON-ready record of a finished span (the JSONL and console format).

One record per line::

    {"name": "agent_session", "trace_id": "<32 hex>", "span_id": "<16 hex>",
     "parent_span_id": "<16 hex>" | null, "start_time_ns": int, "end_time_ns": int,
     "kind": "INTERNAL", "status": {"code": "UNSET"|"OK"|"ERROR", "description": str|null},
     "attributes": {...}, "events": [{"name", "time_ns", "attributes"}],
     "resource": {...}, "scope": "verl_otel_bridge"}

Times are integer nanoseconds since the epoch, so nothing is lost to rounding.

Every line is JSON any RFC 8259 reader takes, written as UTF-8 (:class:`JsonWriter`):
a value JSON cannot carry costs that value only. It is replaced (a string with lone
surrogates gets U+FFFD in their place, ``NaN`` and infinities become the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` as in OTLP's JSON), counted ``converted``
and logged once per kind and key; the span and its batch are written.
"""

from __future__ import annotations

import functools
import json
import json.scanner
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import IO, Any, cast

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from verl_otel_bridge._internal.accounting import CONVERTED, SpanCounts
from verl_otel_bridge._internal.attributes import (
    attributes_dict,
    held_attributes,
    span_attributes,
    span_events,
    to_text,
)
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.protocol import INPUT, INPUT_APPENDED, REDACTED

logger = logging.getLogger(__name__)

_HEX = re.compile(r"[0-9a-f]+")
_SURROGATE = re.compile("[\ud800-\udfff]")

#: ``count()``: called once per value a :class:`JsonWriter` replaced (the bridge counts ``converted``).
Count = Callable[[], object]


class JsonWriter:
    """``json.dumps(value, ensure_ascii=False, **options)``, always JSON that RFC 8259 readers take and UTF-8 can write.

    A value JSON cannot carry is replaced, never the whole text refused: a string with
    lone surrogates (a file name ``os.fsdecode`` made from bytes that are not UTF-8)
    gets U+FFFD in their place (a well-formed pair becomes its character), ``NaN`` and
    infinities the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (as OTLP's JSON
    writes them), an integer too long for Python to write in decimal (``int`` has a
    4,300-digit limit) its hexadecimal text, and any other value (a key or value
    ``json`` has no form for) its text. Each replacement calls ``count()`` and is
    logged once per kind and key.

    The usual text costs one encoding and a check that it is ASCII (or has no
    surrogate); the replacing walk runs only when that fails.
    """

    def __init__(self, count: Count | None = None, **options: Any) -> None:
        self._encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, **options).encode
        self._count = count
        self._once = OnceLogger(logger)

    def __call__(self, value: Any) -> str:
        """``value`` as JSON text."""
        try:
            text = self._encode(value)
        except (ValueError, TypeError):  # NaN or infinity, an int too long to write, a value JSON has no form for
            pass
        else:
            if text.isascii() or not _SURROGATE.search(text):
                return text
        return self._encode(self._replaced(value, ""))

    def _replaced(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            if value.isascii() or not _SURROGATE.search(value):
                return value
            return self._note("text that is not valid Unicode (lone surrogates became U+FFFD)", where, valid(value))
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            try:
                repr(value)
            except ValueError:
                return self._note("an integer too long to write in decimal (written in hexadecimal)", where, hex(value))
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            text = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            return self._note("a number JSON has no form for (written as text)", where, text)
        if isinstance(value, Mapping):
            return {self._key(key, where): self._replaced(item, _inside(where, key)) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._replaced(item, where) for item in value]
        kind = f"a {type(value).__name__}, which JSON has no form for (written as text)"
        return self._note(kind, where, to_text(value))

    def _key(self, key: Any, where: str) -> str:
        text = key if isinstance(key, str) else to_text(key)
        return self._replaced(text, _inside(where, text))  # type: ignore[no-any-return]

    def _note(self, kind: str, where: str, replacement: str) -> str:
        if self._count is not None:
            self._count()
        self._once.log(
            f"{kind}:{where}", logging.WARNING, "%s: %s; only that value was changed", where or "a value", kind
        )
        return replacement


def valid(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a surrogate pair becomes the character it encodes)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _inside(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def span_to_record(span: ReadableSpan) -> dict[str, Any]:
    """Describe ``span`` as a JSON-ready dict (:class:`RecordLines` writes it as a line)."""
    return {
        **_record_head(span, _plain(span_attributes(span))),
        "resource": _plain(span.resource.attributes) if span.resource is not None else {},
        "scope": span.instrumentation_scope.name if span.instrumentation_scope is not None else None,
    }


def _record_head(span: ReadableSpan, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The record's fields up to its events (those that differ from span to span)."""
    context = span.get_span_context()
    parent = span.parent
    status = span.status
    events = span_events(span)
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x") if context else None,
        "span_id": format(context.span_id, "016x") if context else None,
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "start_time_ns": span.start_time,
        "end_time_ns": span.end_time,
        "kind": _KIND_NAMES[span.kind],
        "status": {"code": _STATUS_NAMES[status.status_code], "description": status.description},
        "attributes": attributes,
        "events": [
            {"name": event.name, "time_ns": event.timestamp, "attributes": _plain(event.attributes)} for event in events
        ]
        if events
        else [],
    }


class RecordLines:
    """Spans as JSON Lines: ``json.loads(lines.line(span)) == span_to_record(span)``, the same text as
    ``json.dumps(span_to_record(span), ensure_ascii=False) + "\\n"`` (but for the values
    :class:`JsonWriter` replaces: every line is JSON, and UTF-8 can write it).

    What the export thread of ``jsonl`` (and the spill, and ``console``) spends per span:
    the resource and scope, which every span of a provider shares, are encoded once for
    all its spans, and the attributes go to the encoder as the span holds them (JSON
    writes a tuple as an array) instead of as a copy first.
    """

    def __init__(self, counts: SpanCounts | None = None) -> None:
        """Each value replaced (see :class:`JsonWriter`) is counted ``converted`` in ``counts``."""
        self._encode = JsonWriter(functools.partial(counts.add, CONVERTED) if counts is not None else None)
        # (resource, scope, their encoding): the last seen; a provider's spans share both objects
        self._tail: tuple[Resource | None, InstrumentationScope | None, str] = (None, None, "")

    def line(self, span: ReadableSpan, **extra: str) -> str:
        """``span`` as one line (ending in a newline), with the ``extra`` fields after the record's own."""
        head = self._encode(_record_head(span, held_attributes(span)))
        resource, scope, tail = self._tail
        if resource is not span.resource or scope is not span.instrumentation_scope or not tail:
            tail = self._encode_tail(span.resource, span.instrumentation_scope)
        if extra:
            tail = f"{tail[:-1]}, {self._encode(extra)[1:]}"
        return f"{head[:-1]}, {tail}\n"

    def _encode_tail(self, resource: Resource | None, scope: InstrumentationScope | None) -> str:
        tail = self._encode(
            {
                "resource": _plain(resource.attributes) if resource is not None else {},
                "scope": scope.name if scope is not None else None,
            }
        )[1:]
        self._tail = (resource, scope, tail)
        return tail


_KIND_NAMES = {kind: kind.name for kind in SpanKind}
_STATUS_NAMES = {code: code.name for code in StatusCode}


#: ``ReadableSpan`` fields whose reading builds something (a copy, a view): read only when not replaced.
_BUILT_ON_READ = {name: attrgetter(name) for name in ("attributes", "events", "links", "resource")}
#: Where a ``ReadableSpan`` keeps each constructor argument: the fields its constructor sets.
_FIELDS = {name.removeprefix("_"): name for name in vars(ReadableSpan(name=""))}
_HELD = frozenset(_FIELDS.values())


def replace_span(span: ReadableSpan, **changes: Any) -> ReadableSpan:
    """A copy of ``span`` with some of ``ReadableSpan``'s constructor arguments replaced.

    From an SDK span, the fields are copied as the span holds them (a ``ReadableSpan``
    with the fields its constructor sets, a third of the constructor's cost); from any
    other span, read through its properties.
    """
    held = getattr(span, "__dict__", None)
    if isinstance(span, ReadableSpan) and held is not None and held.keys() >= _HELD:
        copy = ReadableSpan.__new__(ReadableSpan)
        fields = copy.__dict__
        for field in _FIELDS.values():
            fields[field] = held[field]
        for name, value in changes.items():
            fields[_FIELDS[name]] = value
        return copy
    arguments: dict[str, Any] = {
        "name": span.name,
        "context": span.get_span_context(),
        "parent": span.parent,
        "kind": span.kind,
        "status": span.status,
        "start_time": span.start_time,
        "end_time": span.end_time,
        "instrumentation_scope": span.instrumentation_scope,
        **changes,
    }
    for name, read in _BUILT_ON_READ.items():
        if name not in arguments:
            arguments[name] = read(span)
    return ReadableSpan(**arguments)


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    if not attributes:
        return {}
    if attributes.__class__ is not dict:  # the SDK's attribute container answers each item with a Python call
        attributes = attributes_dict(attributes)
    return {key: list(value) if isinstance(value, tuple) else value for key, value in attributes.items()}


# -- records -> spans ------------------------------------------------------------


def record_to_span(record: Mapping[str, Any]) -> ReadableSpan:
    """Rebuild the ``ReadableSpan`` a record of :mod:`verl_otel_bridge._internal.records` describes.

    Ids, nanosecond times, kind, status, attributes (JSON lists become tuples),
    events, resource and scope name are restored exactly, so
    ``span_to_record(record_to_span(r)) == r`` for any record the bridge wrote.

    Raises:
        ValueError: the record lacks a field or a field has the wrong form.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"a span record is a JSON object, not {type(record).__name__}")
    try:
        name = record["name"]
        if not isinstance(name, str):
            raise ValueError(f"name is {type(name).__name__}, not a string")
        trace_id = _hex_id(record.get("trace_id"), 32, "trace_id")
        span_id = _hex_id(record.get("span_id"), 16, "span_id")
        parent_id = _hex_id(record.get("parent_span_id"), 16, "parent_span_id")
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = (
            SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)
            if trace_id is not None and span_id is not None
            else None
        )
        parent = (
            SpanContext(trace_id or 0, parent_id, is_remote=False, trace_flags=flags) if parent_id is not None else None
        )
        start, end = (
            _time(record.get("start_time_ns"), "start_time_ns"),
            _time(record.get("end_time_ns"), "end_time_ns"),
        )
        kind = SpanKind[str(record.get("kind") or "INTERNAL")]
        status = record.get("status") or {}
        if not isinstance(status, Mapping):
            raise ValueError("status is not an object")
        status_obj = Status(StatusCode[str(status.get("code") or "UNSET")], status.get("description"))
        events = [
            Event(
                str(event["name"]),
                _attributes(event.get("attributes"), "event attributes"),
                _time(event.get("time_ns"), "event time_ns"),
            )
            for event in (record.get("events") or [])
        ]
        resource = Resource(dict(_attributes(record.get("resource"), "resource") or {}))
        scope = record.get("scope")
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=resource,
            attributes=_attributes(record.get("attributes"), "attributes"),
            events=events,
            kind=kind,
            status=status_obj,
            start_time=start,
            end_time=end,
            instrumentation_scope=InstrumentationScope(str(scope)) if scope is not None else None,
        )
    except KeyError as exc:
        raise ValueError(f"missing or unknown value {exc}") from None
    except (TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


def _hex_id(value: Any, width: int, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != width or not _HEX.fullmatch(value):
        raise ValueError(f"{what} must be {width} lowercase hex digits, not {value!r}")
    return int(value, 16)


def _time(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be integer nanoseconds, not {value!r}")
    return value


def _attributes(value: Any, what: str) -> BoundedAttributes | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is not an object")
    plain = {str(k): tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return BoundedAttributes(maxlen=None, attributes=plain, immutable=True, max_value_len=None)


#: ``json.loads`` without its per-call checks (readers parse every line of a capture).
_DECODER = json.JSONDecoder()
#: The scanner ``decode()`` calls (typeshed types its argument as a scanner; it is the decoder).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(cast(Any, _DECODER))


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``, with any text that is not JSON (nested too deeply for the parser too) a ``ValueError``.

    Raises:
        ValueError: ``text`` is not JSON (``UnicodeDecodeError`` for bytes that are not UTF-8).
    """
    if not isinstance(text, str):
        text = text.decode("utf-8")
    try:
        try:
            value, end = _SCAN(text, 0)  # what decode() does, without its two regular expressions
        except StopIteration:
            end = -1
        return value if end == len(text) else _DECODER.decode(text)  # whitespace around it, an error: said
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def iter_lines(stream: IO[bytes]) -> Iterator[tuple[int, int, dict[str, Any] | None, str | None]]:
    """``(line number, bytes read, record or None, error or None)`` for each non-blank line of a stream the
    bridge wrote itself (the spill's); captures are read by :mod:`verl_otel_bridge._internal.captures.read`."""
    for number, raw in enumerate(stream, start=1):
        if not raw.strip():
            continue
        record, problem = parse_record(raw)
        yield number, len(raw), record, problem


def parse_record(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One line of JSON Lines as a span record, or None and why it is not one."""
    try:
        record = parse_json(line.decode("utf-8"))  # (the parser skips the whitespace around a value)
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    problem = _record_problem(record)
    return (None, problem) if problem else (record, None)


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a span record"
    if not isinstance(record.get("name"), str):
        return "no span name"
    if not isinstance(record.get("span_id"), str):
        return "no span_id"
    if not isinstance(record.get("attributes", {}), dict):
        return "attributes is not an object"
    if not isinstance(record.get("status", {}) or {}, dict):
        return "status is not an object"
    return None


def redaction_keys(keys: Iterable[str]) -> frozenset[str]:
    """The attribute keys ``redact_attributes`` names, as they are stored: ``input`` is also a generate
    turn's ``input.appended`` (a turn records what it appended to the conversation, docs/protocol.md)."""
    keys = frozenset(keys)
    return keys | {INPUT_APPENDED} if INPUT in keys else keys


def redact(span: ReadableSpan, keys: frozenset[str]) -> ReadableSpan:
    """``span``, or a copy of it whose span and event attributes under ``keys`` (see :func:`redaction_keys`) are
    ``[REDACTED]``."""
    attributes = span.attributes or {}
    events = span.events
    if not keys.intersection(attributes) and not any(keys.intersection(e.attributes or {}) for e in events):
        return span
    return replace_span(
        span,
        attributes=_mask(attributes, keys),
        events=[Event(e.name, _mask(e.attributes or {}, keys), e.timestamp) for e in events],
    )


def _mask(attributes: Mapping[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    return {key: REDACTED if key in keys else value for key, value in attributes.items()}
