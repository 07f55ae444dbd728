"""A destination: where a batch of spans goes, and the one result it gives back.

Each destination (memory, console, JSON Lines, none, OTLP, RL-Insight) has one
method that takes a batch and returns one :class:`Outcome`; the export chain
(:mod:`verl_otel_bridge._internal.pipeline.chain`) decides what happens next
(spill, fallback, counting), so a destination never counts and never raises
by design (the chain still guards against one that does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.status import Where


@dataclass(frozen=True)
class Outcome:
    """What a destination did with one batch; every span of it is in exactly one of the three.

    Attributes:
        accepted: spans it took.
        left_out: spans it will never take (a value it cannot encode, a span too large for a
            request, spans the server rejected in a partial success): failed, never retried.
        refused: spans it could not take now (unreachable, an answer that refused the batch):
            the chain spills them to be sent again, or hands them to the fallback.
        reason: why some were left out or refused, in one line with secrets masked.
        accepted_via: when the destination took spans by more than one way (RL-Insight's
            hub and its OTLP endpoint), how many each way; they are counted under these names.
    """

    accepted: int
    left_out: int = 0
    refused: Sequence[ReadableSpan] = ()
    reason: str | None = None
    accepted_via: Mapping[str, int] | None = None

    @classmethod
    def refusing(cls, spans: Sequence[ReadableSpan], reason: str) -> Outcome:
        """Nothing taken: every span refused, for ``reason``."""
        return cls(0, refused=spans, reason=reason)


class Destination(Protocol):
    """Where spans go: one batch in, one :class:`Outcome` out."""

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Deliver ``spans``; say what became of each."""
        ...

    def flush(self, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, for work the destination does after ``send`` returned; False on timeout."""
        ...

    def close(self) -> None:
        """Release files and connections; a send in progress (a retry waiting) ends at once."""
        ...

    def where(self) -> Where:
        """Where it writes (a URL or the file as opened) and why its last batch was not all taken."""
        ...
