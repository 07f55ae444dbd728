"""Sending spans through RL-Insight's own API: one ``rl_insight.trace_span`` call per span.

Each call is a fire-and-forget Ray call into RL-Insight's monitor hub actor, which
re-exports the span over OTLP. Fire-and-forget means ``trace_span`` returns
normally even after the hub died, and a hub that found no trace endpoint when it
started drops every span; RL-Insight reports neither. So after each batch this
transport asks the hub, through the same actor handle (Ray runs one handle's calls
in order), whether it is alive and exporting traces.

That handle is ``rl_insight.api._STATE.client._actor`` in RL-Insight 0.3.0 (see :mod:`.private`), a
private name: when it is missing, batches are simply not confirmed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.rl_insight import private

#: How long the export thread waits for RL-Insight's hub to confirm a batch.
HUB_CONFIRM_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HubOutcome:
    """What happened to one batch.

    Attributes:
        sent: spans handed to ``trace_span`` before ``error`` (all of them if no error).
        error: what ``trace_span`` raised, if it did.
        problem: ``(reason, detail)`` when the hub cannot deliver at all
            (``hub_unavailable``, ``hub_no_traces``): then none of the batch counts as sent.
        unconfirmed: the hub did not answer in time; the batch counts as sent.
    """

    sent: int
    error: Exception | None = None
    problem: tuple[str, str] | None = None
    unconfirmed: bool = False


class HubTransport:
    """Calls ``rl_insight.trace_span`` per span and confirms the hub took the batch."""

    def __init__(self, confirm_timeout_s: float = HUB_CONFIRM_TIMEOUT_S) -> None:
        self.confirm_timeout_s = confirm_timeout_s
        self._bad_hub: Any = None
        self._problem: tuple[str, str] | None = None

    def send(
        self, module: ModuleType, spans: Sequence[ReadableSpan], attributes: Sequence[Mapping[str, Any]]
    ) -> HubOutcome:
        """Hand ``spans`` (with ``attributes``, one mapping per span) to RL-Insight; never raises."""
        hub = private.hub_actor(module)
        if self._problem is not None and hub is self._bad_hub:
            return HubOutcome(0, problem=self._problem)  # the same dead hub: do not feed it
        trace_span = module.trace_span
        for index, span in enumerate(spans):
            try:
                trace_span(
                    name=span.name,
                    start_time_ns=span.start_time,
                    end_time_ns=span.end_time,
                    attributes=attributes[index],
                )
            except Exception as exc:  # noqa: BLE001 - e.g. "Failed to submit task to actor" after ray.shutdown()
                outcome = self._confirm(hub, index) if index else None
                return outcome if outcome is not None and outcome.problem else HubOutcome(index, error=exc)
        return self._confirm(hub, len(spans))

    def _confirm(self, hub: Any, sent: int) -> HubOutcome:
        """What became of ``sent`` spans handed to ``hub``: sent, unless it cannot deliver (then remembered)."""
        ray = sys.modules.get("ray")
        if hub is None or ray is None:
            return HubOutcome(sent)  # not RL-Insight 0.3.0's Ray client: nothing to ask
        try:
            status = ray.get(hub.get_status.remote(), timeout=self.confirm_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure to answer means the hub is gone
            if isinstance(exc, getattr(ray.exceptions, "GetTimeoutError", ())):
                return HubOutcome(sent, unconfirmed=True)  # handed over, not confirmed: counted as sent
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            return self._remember(
                hub,
                "hub_unavailable",
                f"RL-Insight's monitor hub actor is gone ({type(exc).__name__}: {first_line}); "
                "rl_insight.trace_span would drop spans without an error",
            )
        if isinstance(status, Mapping) and status.get("otel_traces_enabled") is False:
            return self._remember(
                hub,
                "hub_no_traces",
                "RL-Insight's monitor hub exports no traces (its server was unreachable or advertised no OTLP "
                "port when the hub started, and it does not ask again)",
            )
        return HubOutcome(sent)

    def _remember(self, hub: Any, reason: str, detail: str) -> HubOutcome:
        self._bad_hub, self._problem = hub, (reason, detail)
        return HubOutcome(0, problem=self._problem)
