"""Render spans as an indented tree, one line per span, for people to read."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.protocol import CONTENT, IDENTITY_KEYS, INPUT, INPUT_APPENDED, OUTPUT, TOOL_ARGS
from verl_otel_bridge._internal.records import span_to_record

_T = TypeVar("_T")

_SHOWN_IDENTITY = ("sample", "session", "traj", "global_steps", "uid")
# C0 and C1 control characters, DEL and the bidirectional overrides: what can move a
# terminal's cursor, set its title or clipboard, or make text read differently.
_ESCAPED = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
}
#: The attributes that hold a conversation's text: ``show --text`` prints them whole under their span.
TEXT_KEYS = (INPUT, INPUT_APPENDED, TOOL_ARGS, CONTENT, OUTPUT)
# Bookkeeping and GenAI twins of attributes already shown.
_HIDDEN_PREFIXES = ("monitor.", "gen_ai.", "otel.")


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\xNN``), safe to print to a terminal."""
    return text.translate(_ESCAPED)


def display(value: Any) -> str:
    """Any value from a capture as one line of text: strings as they are, others as JSON (never raises)."""
    if isinstance(value, str):
        return value
    try:
        if type(value) is int:  # what json.dumps gives, without its cost (a turn number on every turn span)
            return str(value)  # (a ValueError past sys.get_int_max_str_digits(), as json.dumps raises)
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def render_tree(
    spans: Iterable[ReadableSpan | Mapping[str, Any]], *, max_attributes: int = 6, text_keys: Sequence[str] = ()
) -> str:
    """An indented tree of ``spans`` (SDK spans or JSONL records), children under parents.

    Each line shows the name, the duration, the identity (sample, session,
    traj, global_steps, uid) and up to ``max_attributes`` other attributes
    (``gen_ai.*``, ``monitor.*``, ``otel.*`` and empty values are left out). Spans whose
    parent is not among ``spans`` are shown as roots, ordered by start. Under each
    span, the ``text_keys`` it has, whole (each line indented, control characters escaped).
    """
    records = [span if isinstance(span, Mapping) else span_to_record(span) for span in spans]
    lines: list[str] = []
    for record, depth in depth_first(
        records,
        key=lambda r: r["span_id"],
        parent=lambda r: r.get("parent_span_id") if isinstance(r.get("parent_span_id"), str) else None,
        order=lambda r: (_ns(r.get("start_time_ns")) or 0, r["name"]),
    ):
        attributes = record.get("attributes") or {}
        lines.append("  " * depth + printable(_line(record, attributes, _identity(attributes), max_attributes)))
        for key in text_keys:
            value = attributes.get(key)
            if value is not None:
                indent = "  " * (depth + 2)
                text = display(value).replace("\r\n", "\n")
                lines.append(f"{indent}{key}:")
                lines.extend(indent + "  " + printable(part) for part in text.split("\n"))
    return "\n".join(lines)


_ROOT = object()


def depth_first(
    items: Sequence[_T],
    *,
    key: Callable[[_T], Hashable],
    parent: Callable[[_T], Hashable | None],
    order: Callable[[_T], Any],
) -> Iterator[tuple[_T, int]]:
    """Each of ``items`` once, with its depth: children under their parent, in ``order``.

    An item whose parent is not among ``items`` is a root (depth 0); roots come in
    ``order``. Items caught in a cycle of parents (ids repeated in a capture) come after,
    each as a root. Without recursion: a capture may chain any number of spans.
    """
    keys = {key(item) for item in items}
    children: dict[object, list[_T]] = {}
    for item in items:
        own = parent(item)
        children.setdefault(own if own is not None and own in keys and own != key(item) else _ROOT, []).append(item)
    for group in children.values():
        group.sort(key=order)
    shown: set[int] = set()
    for root in [*children.get(_ROOT, []), *items]:
        stack = [(root, 0)]
        while stack:
            item, depth = stack.pop()
            if id(item) in shown:
                continue
            shown.add(id(item))
            yield item, depth
            stack.extend((child, depth + 1) for child in reversed(children.get(key(item), [])))


def _identity(attributes: Mapping[str, Any]) -> str:
    if "state_lane_id" not in attributes:
        return ""
    return " ".join(f"{key}={_short(attributes[key])}" for key in _SHOWN_IDENTITY if attributes.get(key, "") != "")


def _line(record: Mapping[str, Any], attributes: Mapping[str, Any], identity: str, max_attributes: int) -> str:
    start, end = _ns(record.get("start_time_ns")), _ns(record.get("end_time_ns"))
    duration = f"{(end - start) / 1e6:.1f} ms" if start is not None and end is not None else "?"
    status = record.get("status")
    code = status.get("code", "UNSET") if isinstance(status, Mapping) else "UNSET"
    others = [
        f"{key}={_short(value)}"
        for key, value in attributes.items()
        if key not in IDENTITY_KEYS and not key.startswith(_HIDDEN_PREFIXES) and not _empty(value)
    ]
    extra = " ".join(others[:max_attributes]) + (" ..." if len(others) > max_attributes else "")
    parts = [f"{record['name']} [{duration}]"]
    if code == "ERROR":
        parts.append("ERROR")
    if identity:
        parts.append(f"{{{identity}}}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def _empty(value: Any) -> bool:
    """Whether ``value`` says nothing (``""``, None, an empty list), as ``finish()``'s fields not given."""
    return value is None or (isinstance(value, (str, list, tuple, dict)) and not value)


def _short(value: Any, limit: int = 40) -> str:
    text = str(value) if isinstance(value, (bool, float)) else display(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ns(value: Any) -> int | None:
    """A time in integer nanoseconds, None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
