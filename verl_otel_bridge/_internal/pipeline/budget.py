"""Memory bounds in bytes: a cheap estimate of a span's size, and a budget spans draw from.

The estimate follows what CPython keeps for an ended span (measured with
``tracemalloc``): about 3 KB for a bridge span with the identity and a few small
attributes, plus what each attribute value holds. A sequence item counts as an
int object and its pointer (40 bytes) or as a string of its length (57 + length),
since items of a token-id list are distinct objects; shared values (the identity's,
small ints) are counted as if they were not, so the estimate errs high.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.attributes import attributes_dict, span_attributes, span_events

#: A span, its context, status, resource reference and attribute container.
SPAN_BYTES = 1_500
#: An event and its attribute container.
EVENT_BYTES = 400
#: One attribute's dict slot and key, before its value.
ATTRIBUTE_BYTES = 100
#: One scalar value (int, float, bool: a 32-byte pymalloc block) with its pointer.
SCALAR_BYTES = 40
#: A str object's header.
STR_BYTES = 57
#: A tuple's header.
TUPLE_BYTES = 56
#: Estimated bytes of one batch at most (exported, spilled or drained), whatever the
#: span count, so encoding a batch of spans with large attributes stays bounded too.
MAX_BATCH_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


def span_size(span: ReadableSpan) -> int:
    """The estimated bytes ``span`` holds in memory (attributes and events included)."""
    size = SPAN_BYTES + values_size(span_attributes(span).values())
    events = span_events(span)
    if events:
        for event in events:
            size += EVENT_BYTES + attributes_size(event.attributes)
    return size


def attributes_size(attributes: Mapping[str, Any] | None) -> int:
    """The estimated bytes of ``attributes``' values and keys."""
    return values_size(attributes_dict(attributes).values()) if attributes else 0


def values_size(values: Iterable[Any]) -> int:
    """The estimated bytes of attribute ``values`` with their keys and dict slots."""
    size = 0
    for value in values:
        cls = value.__class__
        if cls is str:
            size += ATTRIBUTE_BYTES + STR_BYTES + len(value)
        elif cls is tuple:
            if value and value[0].__class__ is str:
                size += ATTRIBUTE_BYTES + TUPLE_BYTES + sum(STR_BYTES + 8 + len(item) for item in value)
            else:
                size += ATTRIBUTE_BYTES + TUPLE_BYTES + SCALAR_BYTES * len(value)
        else:
            size += ATTRIBUTE_BYTES + SCALAR_BYTES
    return size


def take_batch(items: collections.deque[tuple[T, int]], max_count: int) -> list[tuple[T, int]]:
    """Pop ``(item, size)`` pairs from the left: at most ``max_count``, and past :data:`MAX_BATCH_BYTES`
    only the first (a span larger than a batch goes alone)."""
    taken: list[tuple[T, int]] = []
    size = 0
    while items and len(taken) < max_count and size < MAX_BATCH_BYTES:
        item = items.popleft()
        taken.append(item)
        size += item[1]
    return taken


class ByteBudget:
    """At most ``limit`` bytes taken at once; ``take`` and ``give`` hold a lock for one addition."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Take ``size`` bytes; False (nothing taken) when that would pass the limit."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        """Return ``size`` bytes taken before."""
        with self._lock:
            self.used -= size
