"""The ``none`` destination: takes every span and keeps nothing (counted ``discarded``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.status import Where


class Discard:
    """Takes every span and drops it."""

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        return Outcome(len(spans))

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass

    def where(self) -> Where:
        return {"endpoint": None, "path": None, "last_error": None}


def build(config: BridgeConfig, counts: SpanCounts) -> Discard:
    """The ``none`` destination."""
    return Discard()


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """``doctor``'s check: always usable."""
    return {"ok": True, "detail": "discarded (counted as discarded)"}
