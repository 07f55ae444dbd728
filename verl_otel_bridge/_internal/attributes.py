"""Making arbitrary values safe as OpenTelemetry attributes, without losing them.

OpenTelemetry drops any attribute value that is not a str, bool, int, float,
bytes or a homogeneous sequence of those, with only a log line. Agent-loop code
passes dicts, numpy scalars and tool results; the bridge converts them instead:

==========================  =================================================
value                       becomes
==========================  =================================================
str, bool, int, float       itself (strings longer than the limit truncated)
int outside int64           its decimal text (OTLP carries int64 only)
None                        the key is left out
bytes                       UTF-8 text (invalid bytes replaced)
numpy scalar / ``.item()``  the Python scalar it holds
mapping                     a JSON string
homogeneous list/tuple      a tuple of the converted items (the first
                            ``max_items``; a longer one is cut, noted
                            ``truncated sequence``)
mixed list/tuple, set       a JSON string
anything else               ``str(value)`` (``repr`` if that raises)
==========================  =================================================

Nothing here raises.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from opentelemetry.attributes import BoundedAttributes

logger = logging.getLogger(__name__)

Primitive: TypeAlias = str | bool | int | float
AttributeValue: TypeAlias = Primitive | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float]

#: Appended to a truncated string; the number is how many characters were cut.
TRUNCATION_MARKER = "...[truncated {} chars]"

_PRIMITIVES = (str, bool, int, float)
_FAST_TYPES = frozenset({bool, float})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Called as ``on_convert(kind, key)`` whenever a value had to be changed.
ConvertHook = Callable[[str, str], None]


def to_attribute_value(
    value: Any,
    max_length: int | None = None,
    *,
    key: str = "",
    on_convert: ConvertHook | None = None,
    max_items: int | None = None,
) -> AttributeValue | None:
    """Convert one value to an OpenTelemetry attribute value (None: leave out).

    Strings are cut at ``max_length`` characters, sequences at ``max_items`` items.
    """
    cls = value.__class__
    if cls in _FAST_TYPES:
        return value  # type: ignore[no-any-return]
    if cls is int:
        return _int(value, key, on_convert)
    if cls is str:
        return _truncate(value, max_length, key, on_convert)
    if value is None:
        return None
    try:
        return _convert(value, max_length, key, on_convert, max_items)
    except Exception:  # noqa: BLE001 - a value we cannot read must not break the caller
        _note(on_convert, "unreadable", key)
        return f"<unreadable {cls.__name__}>"


def clean_attributes(
    attributes: Mapping[Any, Any] | None,
    max_length: int | None = None,
    on_convert: ConvertHook | None = None,
    max_items: int | None = None,
) -> dict[str, AttributeValue]:
    """Convert a whole mapping; keys become strings, None values are left out; never raises.

    A sequence of ``(key, value)`` pairs is read as a mapping; a mapping that cannot be
    read (its ``items()`` or ``__getitem__`` raises) gives no attributes.
    """
    if attributes is None or (attributes.__class__ is dict and not attributes):
        return {}
    try:
        # A plain dict cannot fail part-way; any other mapping is read whole first, so its errors stay here.
        items: Any = (
            attributes.items()
            if attributes.__class__ is dict
            else list(attributes.items())
            if isinstance(attributes, Mapping)
            else list(dict(attributes).items())
        )
    except Exception:  # noqa: BLE001 - whatever the caller's object raises, the caller must not see it
        _note(on_convert, "unreadable mapping", "<attributes>")
        return {}
    out: dict[str, AttributeValue] = {}
    for key, value in items:
        if key.__class__ is not str:
            key = to_text(key)
            _note(on_convert, "non-string key", key)
        cls = value.__class__
        if (
            cls in _FAST_TYPES
            or (cls is int and INT64_MIN <= value <= INT64_MAX)
            or (cls is str and (max_length is None or len(value) <= max_length))
        ):
            out[key] = value
            continue
        converted = to_attribute_value(value, max_length, key=key, on_convert=on_convert, max_items=max_items)
        if converted is not None:
            out[key] = converted
    return out


def _convert(
    value: Any, max_length: int | None, key: str, on_convert: ConvertHook | None, max_items: int | None
) -> AttributeValue:
    if isinstance(value, _PRIMITIVES):  # subclasses such as numpy.float64 or IntEnum
        if isinstance(value, str):
            return _truncate(str(value), max_length, key, on_convert)
        _note(on_convert, "scalar", key)
        return (
            bool(value)
            if isinstance(value, bool)
            else _int(int(value), key, on_convert)
            if isinstance(value, int)
            else float(value)
        )
    if isinstance(value, (bytes, bytearray, memoryview)):
        _note(on_convert, "bytes", key)
        return _truncate(bytes(value).decode("utf-8", "replace"), max_length, key, on_convert)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0 and not isinstance(value, (Mapping, list, tuple)):
        scalar = item()
        if isinstance(scalar, _PRIMITIVES):
            _note(on_convert, "scalar", key)
            if isinstance(scalar, str):
                return _truncate(str(scalar), max_length, key, on_convert)
            if isinstance(scalar, bool):
                return scalar
            return _int(int(scalar), key, on_convert) if isinstance(scalar, int) else float(scalar)
    if isinstance(value, Mapping):
        _note(on_convert, "mapping", key)
        return _truncate(to_json(value), max_length, key, on_convert)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # numpy arrays
        value = tolist()
        if isinstance(value, (list, tuple)):
            converted = _sequence(value, max_length, key, on_convert, max_items)
            if isinstance(converted, tuple):  # (a mixed array was noted as such)
                _note(on_convert, "array", key)
            return converted
    if isinstance(value, (list, tuple)):
        return _sequence(value, max_length, key, on_convert, max_items)
    if isinstance(value, (set, frozenset)):
        _note(on_convert, "set", key)
        return _truncate(to_json(sorted(value, key=repr)), max_length, key, on_convert)
    _note(on_convert, "object", key)
    return _truncate(to_text(value), max_length, key, on_convert)


def _sequence(
    value: list[Any] | tuple[Any, ...],
    max_length: int | None,
    key: str,
    on_convert: ConvertHook | None,
    max_items: int | None,
) -> AttributeValue:
    if max_items is not None and len(value) > max_items:
        _note(on_convert, "truncated sequence", key)
        value = value[:max_items]
    items = [to_attribute_value(v, max_length, key=key, on_convert=on_convert, max_items=max_items) for v in value]
    kinds = {type(v) for v in items}
    if len(kinds) <= 1 and not kinds & {tuple, type(None)}:
        return tuple(items)  # type: ignore[return-value]
    if kinds <= {int, float}:
        return tuple(float(v) for v in items)  # type: ignore[arg-type]
    _note(on_convert, "mixed sequence", key)
    return _truncate(to_json(list(value)), max_length, key, on_convert)


def _int(value: int, key: str, on_convert: ConvertHook | None) -> int | str:
    if INT64_MIN <= value <= INT64_MAX:
        return value
    _note(on_convert, "int64 overflow", key)
    return str(value)


def bounded_text(value: Any, max_length: int | None) -> str:
    """``to_text(value)``, truncated to ``max_length`` characters with the truncation marker."""
    return _truncate(to_text(value), max_length, "", None)


def _truncate(text: str, max_length: int | None, key: str, on_convert: ConvertHook | None) -> str:
    if max_length is None or len(text) <= max_length:
        return text
    _note(on_convert, "truncated", key)
    cut = len(text) - max_length
    return text[:max_length] + TRUNCATION_MARKER.format(cut)


def to_json(value: Any) -> str:
    """``value`` as JSON text: what it cannot encode as its text, non-ASCII kept."""
    return json.dumps(_jsonable(value), default=to_text, ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    # Any Mapping (not only dict) as an object, keys json cannot write (tuples, objects) as text.
    if isinstance(value, Mapping):
        return {
            k if k is None or isinstance(k, (str, int, float)) else to_text(k): _jsonable(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def to_text(value: Any) -> str:
    """``str(value)``, or its ``repr`` when ``__str__`` raises; never raises."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001
        try:
            return repr(value)
        except Exception:  # noqa: BLE001
            return f"<unprintable {type(value).__name__}>"


def _note(on_convert: ConvertHook | None, kind: str, key: str) -> None:
    if on_convert is not None:
        on_convert(kind, key)


def attributes_dict(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """A plain dict copy of a span's attributes, fast.

    ``ReadableSpan.attributes`` is a read-only view of the SDK's locked
    ``BoundedAttributes``: ``dict(view)`` walks it key by key under the lock
    (about 2.5 µs for 20 keys), while its own ``copy()`` copies the dict inside
    at C speed (0.3 µs).
    """
    if not attributes:
        return {}
    copy = getattr(attributes, "copy", None)
    copied = copy() if callable(copy) else None
    return copied if isinstance(copied, dict) else dict(attributes)


def span_attributes(span: Any) -> dict[str, Any]:
    """A plain dict copy of an SDK span's attributes, from its attribute container directly.

    ``span.attributes`` wraps the container in a read-only view on each read; for a
    span of another SDK (or another layout) this is :func:`attributes_dict` of it.
    """
    return dict(held_attributes(span))


def held_attributes(span: Any) -> Mapping[str, Any]:
    """An ended SDK span's attributes as the span holds them, not copied: for reading only.

    An ended span's attributes no longer change. For a span of another SDK (or another
    layout) this is :func:`attributes_dict` of it.
    """
    try:
        held = span._attributes
        if held.__class__ is BoundedAttributes:
            return held._dict
        if held.__class__ is dict:
            return held
    except AttributeError:
        pass
    return attributes_dict(span.attributes)


def span_events(span: Any) -> Sequence[Any]:
    """An SDK span's events without the tuple ``span.events`` builds on each read (another SDK's: ``span.events``)."""
    try:
        return span._events  # type: ignore[no-any-return]
    except AttributeError:
        return span.events  # type: ignore[no-any-return]


def span_links(span: Any) -> Sequence[Any]:
    """An SDK span's links without the tuple ``span.links`` builds on each read (another SDK's: ``span.links``)."""
    try:
        return span._links  # type: ignore[no-any-return]
    except AttributeError:
        return span.links  # type: ignore[no-any-return]


def set_clean_attributes(span: Any, *parts: Mapping[str, AttributeValue]) -> None:
    """Set values that are valid OpenTelemetry attributes already (:func:`clean_attributes` output) on ``span``.

    ``parts`` are set in order (a later one's keys win). The SDK's ``set_attributes``
    checks every value again, a type walk per value; these need none, so they go into
    the span's attribute container whole, under the span's and the container's locks,
    as ``set_attributes`` takes them. Only when that changes nothing else: an SDK span
    that has not ended, no value length limit, room for every key under the attribute
    count limit. Otherwise (and for spans of other SDKs) through ``span.set_attributes``.
    """
    _set_clean(span, parts, locked=True)


def stamp_new_span(span: Any, *parts: Mapping[str, AttributeValue]) -> None:
    """:func:`set_clean_attributes` on an SDK span that no other code holds yet (its own tracer's ``on_start``,
    before ``start_span`` returned it): the same, without taking the span's locks."""
    _set_clean(span, parts, locked=False)


def has_attribute(span: Any, key: str) -> bool:
    """Whether ``span`` has an attribute ``key``: for an SDK span one dict lookup (a missing key
    through its ``attributes`` mapping costs an exception), else through ``span.attributes``."""
    try:
        bounded = span._attributes
        if bounded.__class__ is BoundedAttributes:
            return key in bounded._dict
    except AttributeError:  # not the SDK's span, or not this layout
        pass
    attributes = getattr(span, "attributes", None)
    return attributes is not None and key in attributes


def _set_clean(span: Any, parts: tuple[Mapping[str, AttributeValue], ...], *, locked: bool) -> None:
    try:
        bounded = span._attributes
        if (
            bounded.__class__ is BoundedAttributes
            and bounded.max_value_len is None
            and (bounded.maxlen is None or len(bounded._dict) + sum(map(len, parts)) <= bounded.maxlen)
        ):
            if not locked:
                for part in parts:
                    bounded._dict.update(part)
                return
            with span._lock:
                if span._end_time is None:
                    with bounded._lock:
                        for part in parts:
                            bounded._dict.update(part)
                    return
    except AttributeError:  # not the SDK's span, or not this layout
        pass
    for part in parts:
        span.set_attributes(part)
