"""The ``rl_insight`` destination, and ``RLInsightSpanExporter``: RL-Insight, or a fallback when it is unusable."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal import protocol
from verl_otel_bridge._internal.accounting import (
    FALLBACK,
    OTLP_FAILED_BATCHES,
    RL_INSIGHT_ERRORS,
    RL_INSIGHT_UNCONFIRMED,
    SESSION_GAUGES_FAILED,
    SESSION_GAUGES_PUBLISHED,
    SpanCounts,
)
from verl_otel_bridge._internal.attributes import span_attributes
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporter_names import NAMES, destination_module
from verl_otel_bridge._internal.exporters.destination import Destination, Outcome
from verl_otel_bridge._internal.exporters.sdk import SdkExporter
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.pipeline.chain import ExportChain, Named
from verl_otel_bridge._internal.pipeline.route import Route
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge._internal.rl_insight import private
from verl_otel_bridge._internal.rl_insight.compat import Probe
from verl_otel_bridge._internal.rl_insight.gauges import GaugePublisher
from verl_otel_bridge._internal.rl_insight.hub import HubTransport
from verl_otel_bridge._internal.rl_insight.notices import UnusableNotice
from verl_otel_bridge._internal.rl_insight.otlp import DEFAULT_NAMESPACE, OtlpTransport, otlp_settings
from verl_otel_bridge._internal.rl_insight.sessions import is_session_span, publish_session_gauges
from verl_otel_bridge._internal.signals import ThreadsRefused, start_thread
from verl_otel_bridge._internal.status import Where

logger = logging.getLogger(__name__)

#: The ways spans reach RL-Insight, each counted as ``exported.<way>``.
HUB_WAY, OTLP_WAY = "rl_insight", "rl_insight_otlp"


class RLInsightSpanExporter(SpanExporter):
    """A ``SpanExporter`` that calls ``rl_insight.trace_span`` for each span (``OTEL_TRACES_EXPORTER=rl_insight``).

    RL-Insight is used only when it is *usable* (see
    :mod:`verl_otel_bridge._internal.rl_insight.compat`): importable, ``__version__`` >=
    ``minimum_version``, ``trace_span`` callable, a server URL set and Ray
    initialised at export time. Then ``rl_insight.init`` runs once per process
    with the project and experiment name. Otherwise spans go to ``fallback``
    (a bounded in-memory exporter by default), one log line per reason says
    why, and :meth:`status` keeps saying it. A ``trace_span`` call that raises
    sends that span and the rest of its batch to the fallback; so does a batch
    RL-Insight's hub does not confirm (a dead hub actor, or one exporting no
    traces: ``trace_span`` reports neither). Nothing here raises into the caller.

    ``transport`` picks how spans reach RL-Insight's trace store (see
    :mod:`verl_otel_bridge._internal.rl_insight.otlp`): ``hub`` calls
    ``rl_insight.trace_span`` per span; ``otlp`` sends batches straight to the
    endpoint RL-Insight's server advertises, as the hub would, keeping real
    parent/child ids; ``auto`` (default) uses ``otlp`` when the endpoint is
    discovered and ``hub`` otherwise. A failed OTLP export goes through the hub.

    ``agent_session`` spans made by the bridge's sessions also publish RL-Insight's
    agent-loop dashboard gauges (see :mod:`verl_otel_bridge._internal.rl_insight.sessions`);
    RL-Insight still receives exactly one ``agent_session`` span per session,
    with the session's real start and end.

    Args:
        fallback: where spans go when RL-Insight is unusable; default: the
            config's ``fallback`` (a bounded in-memory exporter by default).
        minimum_version: the oldest RL-Insight forwarded to; default: the
            config's ``rl_insight_min_version`` (0.3.0).
        config: project, experiment, server URL, ``rl_insight.init`` config,
            transport and reminder interval; default: read from the environment
            (so ``OTEL_TRACES_EXPORTER=rl_insight`` works with no arguments; built
            so, the exporter also applies ``redact_attributes`` itself).
        explicit: RL-Insight was asked for by name, so being unusable is a
            WARNING; under ``auto`` it is an INFO.
        counts: where outcomes are counted (``exported.rl_insight``,
            ``fallback``, ``failed``); a private counter when None.
    """

    def __init__(
        self,
        fallback: SpanExporter | None = None,
        minimum_version: str | None = None,
        *,
        config: BridgeConfig | None = None,
        explicit: bool = True,
        counts: SpanCounts | None = None,
    ) -> None:
        by_name = config is None  # e.g. OTEL_TRACES_EXPORTER=rl_insight: no bridge pipeline around it
        self.config = config if config is not None else BridgeConfig.resolve()
        self.counts = counts if counts is not None else SpanCounts()
        if fallback is None:
            self.fallback_name = self.config.fallback
            local: Destination = destination_module(self.fallback_name).build(self.config, self.counts)
        else:
            self.fallback_name = type(fallback).__name__
            local = SdkExporter(fallback)
        self.fallback = local
        self.explicit = explicit
        self.forwarder = RLInsightDestination(
            self.config,
            minimum_version or self.config.rl_insight_min_version,
            explicit=explicit,
            counts=self.counts,
            fallback_name=self.fallback_name,
        )
        # Built by name it is the whole chain, so it redacts as the bridge's pipeline does in front of it.
        self.chain = ExportChain(
            Named("rl_insight", self.forwarder),
            self.counts,
            fallback=Named(self.fallback_name, local, discards=fallback is None and NAMES[self.fallback_name].discards),
            redact_keys=self.config.redact_attributes if by_name else (),
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Forward ``spans`` (what RL-Insight cannot take goes to the fallback); ``FAILURE`` if any was lost."""
        return SpanExportResult.SUCCESS if self.chain.export(spans) else SpanExportResult.FAILURE

    def start_probe(self) -> None:
        """Start checking RL-Insight on a thread of its own (see :meth:`RLInsightDestination.start_probe`)."""
        self.forwarder.start_probe()

    def probe(self, *, initialize: bool = False) -> Probe:
        """Check RL-Insight now; with ``initialize``, also run ``rl_insight.init`` once if needed."""
        return self.forwarder.probe(initialize=initialize)

    def status(self) -> dict[str, Any]:
        """Where spans go and why, RL-Insight's version, and the counters."""
        return {**self.forwarder.status(), "counters": self.counts.snapshot()}

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.chain.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        self.chain.close()


class RLInsightDestination:
    """The ``rl_insight`` destination: sends what RL-Insight takes now, refuses the rest (for the fallback).

    Checks RL-Insight (the probe), runs ``rl_insight.init`` once, picks the transport,
    publishes the sessions' dashboard gauges and says why it is unusable; the export
    chain sends what it refuses to the fallback.
    """

    def __init__(
        self, config: BridgeConfig, minimum_version: str, *, explicit: bool, counts: SpanCounts, fallback_name: str
    ) -> None:
        self.config = config
        self.minimum_version = minimum_version
        self.counts = counts
        self.fallback_name = fallback_name
        self._new_lock()
        reinit_after_fork(self._new_lock)
        self._static: Probe | None = None
        self._last: Probe | None = None
        self._once = OnceLogger(logger)
        self._notice = UnusableNotice(
            logger,
            explicit=explicit,
            fallback_name=fallback_name,
            reminder_interval_s=config.reminder_interval_s,
        )
        # Checked now, so a bad otlp_* setting (OTEL_EXPORTER_OTLP_*) raises at configure().
        self._otlp_settings = otlp_settings(config)
        self._otlp: OtlpTransport | None = None
        self._last_transport: str | None = None
        self._hub = HubTransport()
        self._gauges: GaugePublisher[tuple[Probe, ReadableSpan]] = GaugePublisher(
            lambda item: self._publish_gauges(*item), counts
        )

    def _new_lock(self) -> None:
        self._lock = threading.Lock()  # also after a fork: the export thread may have held it

    def start_probe(self) -> None:
        """Start checking RL-Insight on a thread of its own.

        Importing RL-Insight pulls in Ray (seconds): the bridge's pipeline calls this
        when it builds the exporter, so the first export does not stall while spans
        pile up in the queue. Without it the first export probes.
        """
        with contextlib.suppress(ThreadsRefused):  # the interpreter is exiting: the first export probes
            start_thread(self._static_probe, "verl-otel-bridge-probe")

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Send ``spans`` to RL-Insight: over its OTLP endpoint when ready, what that refused through the hub;
        refused (for the fallback): what neither took, all of them when RL-Insight is unusable."""
        try:
            probe = self.probe(initialize=True)
        except Exception as exc:  # noqa: BLE001 - a probe bug must not lose spans
            probe = Probe(False, "probe_failed", f"checking RL-Insight raised {type(exc).__name__}: {exc}")
            self._note_unusable(probe)
        if not probe.usable or probe.module is None:
            return Outcome.refusing(spans, probe.detail)
        attributes = [forwarded_attributes(span) for span in spans]
        for span in spans:
            if is_session_span(span):
                self._gauges.submit((probe, span))
        via: dict[str, int] = {}
        left_out = 0
        if self._otlp_ready(probe.module):
            outcome = self._send_otlp(spans, attributes)
            via[OTLP_WAY], left_out = outcome.accepted, outcome.left_out
            taken = len(spans) - len(outcome.refused)
            spans, attributes = spans[taken:], attributes[taken:]
        if spans:
            refused, reason = self._send_hub(probe, spans, attributes, via)
        else:
            refused, reason = (), None
        return Outcome(sum(via.values()), left_out, refused, reason, accepted_via=via)

    def _send_hub(
        self, probe: Probe, spans: Sequence[ReadableSpan], attributes: Sequence[Mapping[str, Any]], via: dict[str, int]
    ) -> tuple[Sequence[ReadableSpan], str | None]:
        """Send through the hub, adding what it took to ``via``; what it refused, and why."""
        assert probe.module is not None
        self._last_transport = "hub"
        outcome = self._hub.send(probe.module, spans, attributes)
        if outcome.problem is not None:
            # The hub cannot deliver: this batch (any of which it may have lost) and later ones go to the fallback.
            problem = rl_insight_compat.with_reason(probe, *outcome.problem)
            self._last = problem
            self._note_unusable(problem)
            return spans, problem.detail
        via[HUB_WAY] = outcome.sent
        if outcome.unconfirmed:
            self.counts.add(RL_INSIGHT_UNCONFIRMED)
            self._once.log(
                "hub-slow",
                logging.WARNING,
                "RL-Insight's monitor hub did not confirm a batch within %.0f s; counted as exported",
                self._hub.confirm_timeout_s,
            )
        if outcome.error is None:
            return (), None
        exc = outcome.error
        self.counts.add(RL_INSIGHT_ERRORS)
        self._once.log(
            f"raised:{type(exc).__name__}",
            logging.WARNING,
            "rl_insight.trace_span raised %s: %s; that span and the rest of its batch (%d) go to the %s exporter",
            type(exc).__name__,
            exc,
            len(spans) - outcome.sent,
            self.fallback_name,
        )
        return spans[outcome.sent :], f"rl_insight.trace_span raised {type(exc).__name__}: {exc}"

    def _otlp_ready(self, module: Any = None) -> bool:
        if self._otlp_settings is None:  # the hub transport, or auto without urllib3
            return False
        if self._otlp is None:
            section = (self.config.rl_insight_config or {}).get("server")
            server: Mapping[str, Any] = section if isinstance(section, Mapping) else {}
            url = self._server_url() or ""
            # What the hub adds comes from RL-Insight's own init (which may not have been the bridge's).
            state = private.state(module)
            labels = getattr(state, "labels", None)
            namespace = getattr(state, "namespace", None) or server.get("namespace") or DEFAULT_NAMESPACE
            self._otlp = OtlpTransport(
                str(url).strip(),
                self._otlp_settings,
                namespace=str(namespace),
                labels=dict(labels)
                if isinstance(labels, Mapping)
                else {"project": self.config.project, "experiment_name": self.config.experiment_name},
            )
        ready = self._otlp.available()
        if not ready and self.config.rl_insight_transport == "otlp":
            self._once.log(
                "otlp-unavailable",
                logging.WARNING,
                "rl_insight_transport=otlp but the trace endpoint is not available (%s); using the hub meanwhile",
                self._otlp.last_error,
            )
        return ready

    def _send_otlp(self, spans: Sequence[ReadableSpan], attributes: Sequence[Mapping[str, Any]]) -> Outcome:
        """What the endpoint did with ``spans``; what it refused is for the hub."""
        assert self._otlp is not None
        outcome = self._otlp.send(spans, attributes)
        if outcome.accepted or outcome.left_out:
            self._last_transport = "otlp"
        if not outcome.refused:
            return outcome
        self.counts.add(OTLP_FAILED_BATCHES)
        self._once.log(
            "otlp-failed",
            logging.WARNING,
            "sending %d spans to %s failed (%s); they go through RL-Insight's hub, and the endpoint is retried "
            "with backoff",
            len(outcome.refused),
            self._otlp.endpoint,
            self._otlp.last_error,
        )
        return outcome

    def _static_probe(self) -> Probe:
        with self._lock:
            if self._static is None:
                self._static = rl_insight_compat.probe_module(self.minimum_version)
            return self._static

    def probe(self, *, initialize: bool = False) -> Probe:
        """Check RL-Insight now; with ``initialize``, also run ``rl_insight.init`` once if needed."""
        static = self._static_probe()
        probe = rl_insight_compat.check_runtime(static, self._server_url())
        if initialize and probe.usable:
            probe = rl_insight_compat.ensure_initialized(
                probe,
                project=self.config.project,
                experiment_name=self.config.experiment_name,
                config=rl_insight_compat.with_server_url(
                    self.config.rl_insight_config, self.config.rl_insight_server_url
                ),
            )
        self._last = probe
        if not probe.usable:
            self._note_unusable(probe)
        return probe

    def _server_url(self) -> str | None:
        return rl_insight_compat.server_url(self.config.rl_insight_server_url, self.config.rl_insight_config)

    def status(self) -> dict[str, Any]:
        """Where spans go and why, RL-Insight's version, and the counters."""
        probe = self._last or self.probe()
        route = "rl_insight" if probe.usable else f"{self.fallback_name} (fallback)"
        where = self.where()
        return {
            "exporter": route,
            "rl_insight_transport": self._last_transport or self.config.rl_insight_transport,
            "otlp_endpoint": where["endpoint"],
            "otlp_error": where["last_error"],
            "reason": probe.reason,
            "detail": probe.detail,
            "rl_insight_installed": probe.reason != "not_installed",
            "rl_insight_version": probe.version,
            "rl_insight_package_version": probe.installed,
        }

    def where(self) -> Where:
        """RL-Insight's OTLP endpoint, once discovered, and the last error sending there."""
        otlp = self._otlp
        return {
            "endpoint": otlp.endpoint if otlp is not None else None,
            "path": None,
            "last_error": otlp.last_error if otlp is not None else None,
        }

    def _publish_gauges(self, probe: Probe, span: ReadableSpan) -> None:
        try:
            publish_session_gauges(probe.module, span)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - gauges are extra; the span still goes out
            self.counts.add(SESSION_GAUGES_FAILED)
            self._once.log(
                f"gauges:{type(exc).__name__}",
                logging.WARNING,
                "agent-loop dashboard gauges not published (%s: %s); session spans are still forwarded",
                type(exc).__name__,
                exc,
            )
        else:
            self.counts.add(SESSION_GAUGES_PUBLISHED)

    def _note_unusable(self, probe: Probe) -> None:
        self._notice.note(probe, self.counts.get(FALLBACK))

    def flush(self, timeout_s: float) -> bool:
        """Wait (bounded) for the sessions' dashboard gauges still being published."""
        return self._gauges.flush(timeout_s)

    def close(self) -> None:
        self._gauges.shutdown()
        if self._otlp is not None:
            self._otlp.shutdown()


def forwarded_attributes(span: ReadableSpan) -> dict[str, Any]:
    """The span's attributes plus its ids, status and first exception, as RL-Insight receives them."""
    attributes = span_attributes(span)
    context = span.get_span_context()
    if context is not None:
        attributes[protocol.TRACE_ID] = format(context.trace_id, "032x")
        attributes[protocol.SPAN_ID] = format(context.span_id, "016x")
    attributes[protocol.PARENT_SPAN_ID] = format(span.parent.span_id, "016x") if span.parent is not None else ""
    attributes[protocol.STATUS_CODE] = span.status.status_code.name
    if span.status.description:
        attributes[protocol.STATUS_DESCRIPTION] = span.status.description
    for event in span.events:
        if event.name == "exception" and event.attributes:
            for key in ("exception.type", "exception.message"):
                if key in event.attributes:
                    attributes.setdefault(key, event.attributes[key])
            break
    return attributes


def build(config: BridgeConfig, counts: SpanCounts) -> RLInsightDestination:
    """The ``rl_insight`` destination of ``config``, its probe started (importing RL-Insight takes seconds)."""
    destination = RLInsightDestination(
        config,
        config.rl_insight_min_version,
        explicit=Route.of(config).explicit,
        counts=counts,
        fallback_name=config.fallback,
    )
    destination.start_probe()
    return destination
