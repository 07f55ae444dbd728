"""Span accounting: where every span went, counted once.

Each span that ends lands in exactly one terminal bucket, so after a flush::

    ended == sum(exported.values()) + fallback + dropped + failed

``exported.<name>`` counts spans the named exporter accepted, ``fallback``
spans the fallback exporter accepted because the preferred one was unusable or
failed, ``dropped`` spans discarded because the export queue was full, and
``failed`` spans no exporter accepted. ``invalid`` counts calls rejected before
a span was made (e.g. ``record_span`` with an end before its start); those
spans never start, so they are outside the equation.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any


class SpanCounts:
    """Thread-safe named counters (``"started"``, ``"exported.memory"``, ...).

    A forked child starts from zero: its counters describe its own spans (the
    parent's queued spans stay with the parent).
    """

    def __init__(self) -> None:
        self._reset()
        ref = weakref.WeakMethod(self._reset)
        os.register_at_fork(after_in_child=lambda: (m := ref()) is not None and m())

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, key: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``key``."""
        if amount:
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + amount

    def get(self, key: str) -> int:
        """The current value of ``key`` (0 if never counted)."""
        with self._lock:
            return self._counts.get(key, 0)

    def snapshot(self) -> dict[str, Any]:
        """Counters for ``status()``: the terminal buckets, ``exported`` by exporter, then any others."""
        with self._lock:
            counts = dict(self._counts)
        exported = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("exported.")}
        summary: dict[str, Any] = {
            key: counts.get(key, 0)
            for key in ("started", "ended", "fallback", "dropped", "failed", "invalid", "converted")
        }
        summary["exported"] = exported
        summary.update({k: v for k, v in counts.items() if k not in summary and not k.startswith("exported.")})
        return summary


def balance(snapshot: dict[str, Any]) -> int:
    """``ended`` minus every terminal bucket: 0 when no span is unaccounted for."""
    terminal: int = sum(snapshot["exported"].values()) + snapshot["fallback"] + snapshot["dropped"] + snapshot["failed"]
    ended: int = snapshot["ended"]
    return ended - terminal
