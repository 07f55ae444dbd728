"""Render spans as an indented tree, one line per span, for people to read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge.protocol import IDENTITY_KEYS
from verl_otel_bridge.records import span_to_record

_SHOWN_IDENTITY = ("sample", "session", "traj", "global_steps", "uid")
# Bookkeeping and GenAI twins of attributes already shown.
_HIDDEN_PREFIXES = ("monitor.", "gen_ai.", "otel.")


def render_tree(spans: Iterable[ReadableSpan | Mapping[str, Any]], *, max_attributes: int = 6) -> str:
    """An indented tree of ``spans`` (SDK spans or JSONL records), children under parents.

    Each line shows the name, the duration, the identity (sample, session,
    traj, global_steps, uid) and up to ``max_attributes`` other attributes
    (``gen_ai.*``, ``monitor.*`` and ``otel.*`` are left out). Spans whose
    parent is not among ``spans`` are shown as roots, ordered by start.
    """
    records = [span if isinstance(span, Mapping) else span_to_record(span) for span in spans]
    ids = {r["span_id"] for r in records}
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    for record in records:
        parent = record.get("parent_span_id")
        children.setdefault(parent if parent in ids else None, []).append(record)
    for group in children.values():
        group.sort(key=lambda r: (r.get("start_time_ns") or 0, r["name"]))
    lines: list[str] = []

    def walk(record: Mapping[str, Any], depth: int) -> None:
        lines.append("  " * depth + _line(record, _identity(record["attributes"]), max_attributes))
        for child in children.get(record["span_id"], []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    return "\n".join(lines)


def _identity(attributes: Mapping[str, Any]) -> str:
    if "state_lane_id" not in attributes:
        return ""
    return " ".join(f"{key}={attributes[key]}" for key in _SHOWN_IDENTITY if attributes.get(key, "") != "")


def _line(record: Mapping[str, Any], identity: str, max_attributes: int) -> str:
    start, end = record.get("start_time_ns"), record.get("end_time_ns")
    duration = f"{(end - start) / 1e6:.1f} ms" if start is not None and end is not None else "?"
    status = record.get("status", {}).get("code", "UNSET")
    others = [
        f"{key}={_short(value)}"
        for key, value in record["attributes"].items()
        if key not in IDENTITY_KEYS and not key.startswith(_HIDDEN_PREFIXES)
    ]
    extra = " ".join(others[:max_attributes]) + (" ..." if len(others) > max_attributes else "")
    parts = [f"{record['name']} [{duration}]"]
    if status == "ERROR":
        parts.append("ERROR")
    if identity:
        parts.append(f"{{{identity}}}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def _short(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
