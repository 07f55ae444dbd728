"""The bridge's default sampler: OpenTelemetry's default decisions, at less cost per span.

``ParentBased(ALWAYS_ON)`` asks a second sampler for each span and builds a new
``SamplingResult`` (with a new read-only view of no attributes) every time.
:class:`ParentBasedAlwaysOn` decides the same for every parent, and hands out one
shared result when the span has no attributes of its own and no trace state to carry,
which is every span the bridge starts itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_TRACES_SAMPLER
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

#: ``OTEL_TRACES_SAMPLER``'s value for what this sampler decides (also the SDK's default).
SDK_NAME = "parentbased_always_on"
_DESCRIPTION: str = ParentBased(ALWAYS_ON).get_description()  # type: ignore[no-untyped-call]


class ParentBasedAlwaysOn(Sampler):
    """Samples a span when its parent was sampled or it has none: ``ParentBased(ALWAYS_ON)``'s decisions."""

    _SAMPLED = SamplingResult(Decision.RECORD_AND_SAMPLE)
    _DROPPED = SamplingResult(Decision.DROP)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        if parent.is_valid:
            if not parent.trace_flags.sampled:
                return SamplingResult(Decision.DROP, None, parent.trace_state) if parent.trace_state else self._DROPPED
            if parent.trace_state or attributes:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state)
        elif attributes:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self._SAMPLED

    def get_description(self) -> str:
        return _DESCRIPTION


def default_sampler() -> Sampler | None:
    """:class:`ParentBasedAlwaysOn` unless ``OTEL_TRACES_SAMPLER`` names another sampler (None: the SDK
    builds that one, as it reads the variable itself)."""
    return ParentBasedAlwaysOn() if os.environ.get(OTEL_TRACES_SAMPLER, SDK_NAME).strip().lower() == SDK_NAME else None
