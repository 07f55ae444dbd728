"""The bridge: a tracer whose spans carry the session identity and go where the config says."""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import multiprocessing.util
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, overload

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.util.instrumentation import InstrumentationInfo, InstrumentationScope
from opentelemetry.trace import (
    NoOpTracer,
    Span,
    Tracer,
)

from verl_otel_bridge._internal.accounting import IDENTITY_LOST, SpanCounts
from verl_otel_bridge._internal.agent_loop import TaskHandle, TurnHandle, task_span, turn_span
from verl_otel_bridge._internal.assembly import Pipeline
from verl_otel_bridge._internal.attributes import AttributeValue, clean_attributes, to_text
from verl_otel_bridge._internal.config import BridgeConfig, did_you_mean
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.identity import IdentityFields, SessionIdentity, current_identity, using_identity
from verl_otel_bridge._internal.inflight import InflightSessions
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.pipeline.processors import (
    BridgeSpanProcessors,
    IdentitySpanProcessor,
)
from verl_otel_bridge._internal.protocol import KNOWN_STATUSES, SESSION_SPAN_NAME
from verl_otel_bridge._internal.sampler import default_sampler
from verl_otel_bridge._internal.session import Session, SessionScope, session_start_attributes
from verl_otel_bridge._internal.signals import flush_on_sigterm
from verl_otel_bridge._internal.spans import NOOP_SPAN, F, SpanScope, StartSpan, timing_problem, traced_by
from verl_otel_bridge._internal.status import BridgeStatus, printable
from verl_otel_bridge._version import __version__

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from verl_otel_bridge._internal.rl_insight.compat import Probe

logger = logging.getLogger(__name__)


class Bridge:
    """Owns a ``TracerProvider``, its identity stamping, export queue and exporters.

    Usually made by :func:`verl_otel_bridge.configure`; a bridge made directly
    is shut down at interpreter exit unless :meth:`shutdown` ran first. Given a
    ``provider`` (see :func:`verl_otel_bridge.instrument`), the bridge adds its
    processors to that provider instead of making its own, and its shutdown
    leaves the provider running.

    Raises:
        ValueError: the config cannot be used (e.g. an unwritable ``jsonl_path``).
    """

    def __init__(self, config: BridgeConfig | None = None, *, provider: TracerProvider | None = None) -> None:
        self.config = config if config is not None else BridgeConfig.resolve()
        self._owns_provider = provider is None
        self.counts = SpanCounts()
        self._once = OnceLogger(logger)
        self._max_attribute_length = self.config.max_attribute_length
        self._max_attribute_items = self.config.max_attribute_items
        self._on_convert = self._note_conversion  # bound once: spans convert their attributes with it
        self._pipeline = Pipeline(self.config, self.counts)
        self._processor = self._pipeline.processor
        self._identity_processor = IdentitySpanProcessor(self._note_lost_identity)
        self._inflight = InflightSessions(self.counts, self.config.progress_interval_s, self.config.straggler_factor)
        self._provider: TracerProvider | None = None
        self._start_span: StartSpan = self._start_stamped
        self._closed = False
        #: Shut down by ``vob.shutdown()``: the next span makes a new current bridge (see ``get_bridge``).
        self.retired = False
        self._closing_thread: threading.Thread | None = None
        self._shut_down = threading.Event()
        if self._processor is not None:
            self._provider = provider or TracerProvider(
                resource=Resource.create({"service.name": self.config.service_name}),
                sampler=default_sampler(),
                shutdown_on_exit=False,
            )
            processors = BridgeSpanProcessors(self._identity_processor, self._inflight, self._processor)
            self._provider.add_span_processor(processors)
            self.tracer: Tracer = _own_tracer(self._provider, processors)
            if self._owns_provider:
                # The identity processor is first on the bridge's own provider: it takes each
                # span's clean attributes and the identity whole.
                self._start_span = functools.partial(self._identity_processor.start_span, self.tracer)
            self._inflight.bind(self.tracer)
        else:
            self.tracer = NoOpTracer()
        atexit.register(self._at_exit)
        self._sigterm = (
            flush_on_sigterm(*_sigterm_hooks(weakref.ref(self)))
            if self._provider is not None and self.config.handle_sigterm
            else None
        )
        self._mp_exit: multiprocessing.util.Finalize | None = None
        _shut_down_at_multiprocessing_exit(self)
        multiprocessing.util.register_after_fork(self, _shut_down_at_multiprocessing_exit)

    # -- spans ---------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False when the config (or ``OTEL_SDK_DISABLED``) turned tracing off."""
        return self._provider is not None

    def session(
        self, *, state_lane_id: str | None = None, **identity: Unpack[IdentityFields]
    ) -> AbstractContextManager[Session]:
        """Run the block as one agent-loop session (an ``agent_session`` span).

        Every span started inside, at any depth and in asyncio tasks created
        inside, carries the session's identity. ``project`` and
        ``experiment_name`` default to the config's. If the block raises, the
        session span gets status ERROR, an exception event and
        ``status="error"`` (``"cancelled"`` for a cancelled task), and the
        exception propagates unchanged. Without an explicit ``finish``, a
        normal exit finishes with ``status="success"``.

        The keywords are the identity (:class:`~verl_otel_bridge._internal.identity.IdentityFields`):
        ``sample`` and ``session`` (required), ``traj`` (default 0), ``uid``,
        ``global_steps``, ``session_id``, ``project``, ``experiment_name``. The block
        gets the :class:`~verl_otel_bridge._internal.session.Session`: ``task()``, ``turn()``,
        ``finish(status=..., **attributes)``, ``span`` (the OpenTelemetry span) and
        ``identity``.

        ``bridge.session(**identity.to_dict())`` works: ``state_lane_id`` is
        accepted and checked (a mismatch is logged; the keys win).
        """

        def start() -> Session:
            session = self.start_session(**identity)
            if state_lane_id is not None and state_lane_id != session.identity.state_lane_id:
                self._once.log(
                    "state_lane_id",
                    logging.WARNING,
                    "session(state_lane_id=%r) does not match its keys; using %r",
                    state_lane_id,
                    session.identity.state_lane_id,
                )
            return session

        return SessionScope(start)

    def start_session(self, **fields: Unpack[IdentityFields]) -> Session:
        """Start a session without making it current: its ``agent_session`` span starts now and
        ends when the caller calls ``session.span.end()``.

        For APIs shaped like RL-Insight's ``agent_loop_session`` (see
        :mod:`verl_otel_bridge.verl`); :meth:`session` is the usual way. ``project``
        and ``experiment_name`` default to the config's.
        """
        if fields.get("project") is None:
            fields["project"] = self.config.project
        if fields.get("experiment_name") is None:
            fields["experiment_name"] = self.config.experiment_name
        identity = SessionIdentity.create(
            max_length=self._max_attribute_length, on_convert=self._note_conversion, **fields
        )
        with using_identity(identity):  # so no enclosing session's identity is stamped over it
            span = self._start_span(SESSION_SPAN_NAME, {**identity.attributes, **session_start_attributes(identity)})
        return Session(identity, span, self)

    def span(self, name: str, /, **attributes: Any) -> AbstractContextManager[Span]:
        """A context manager around one span named ``name``, yielding the OpenTelemetry span.

        Attribute values are converted to what OpenTelemetry accepts (see
        :mod:`verl_otel_bridge._internal.attributes`) instead of being dropped. An
        exception in the block is recorded on the span and propagates.
        """
        if self._provider is None:
            return NOOP_SPAN
        if name.__class__ is not str or not name:
            name = self._span_name(name)
        return SpanScope(self._start_span, name, self.clean_attributes(attributes) if attributes else None)

    @overload
    def traced(self, name: F, /) -> F: ...

    @overload
    def traced(self, name: str | None = None, /, **attributes: Any) -> Callable[[F], F]: ...

    def traced(self, name: str | Callable[..., Any] | None = None, /, **attributes: Any) -> Any:
        """Decorator: run each call of a sync or async function inside ``span(name)``.

        ``name`` defaults to the function's qualified name; ``@bridge.traced``
        also works without parentheses.
        """
        return traced_by(lambda: self, name, attributes)

    def task(self, name: str, /, **attributes: Any) -> AbstractContextManager[TaskHandle]:
        """An ``agent_task`` span (``monitor.trace_source="task"``, ``task_name``), yielding a
        :class:`~verl_otel_bridge._internal.agent_loop.TaskHandle` whose ``set_result`` sets ``status``,
        ``reward``, ``accuracy``, ``finished``, ``error``, ``reward_posted``."""
        return task_span(self, name, attributes)

    def turn(self, turn: int, /, *, type: str = "generate", **attributes: Any) -> AbstractContextManager[TurnHandle]:
        """An ``agent_turn`` span with integer ``turn`` and ``type``, yielding a
        :class:`~verl_otel_bridge._internal.agent_loop.TurnHandle` whose ``record`` sets tokens, finish
        reason, tools, content and reasoning (each with its ``gen_ai.*`` twin)."""
        return turn_span(self, turn, type, attributes)

    def resume(self, identity: SessionIdentity | Mapping[str, Any]) -> AbstractContextManager[SessionIdentity | None]:
        """Continue a session's identity elsewhere, without a second ``agent_session`` span.

        ``identity`` is a :class:`SessionIdentity` or its ``to_dict()`` (e.g. handed to
        a tool in its kwargs). Spans started inside carry that identity. A dict that
        cannot be read is logged and the block runs without identity.
        """
        if not isinstance(identity, SessionIdentity):
            try:
                identity = SessionIdentity.from_dict(identity)
            except Exception as exc:  # noqa: BLE001 - e.g. a mapping whose reads raise; never into the caller
                self._once.log("resume", logging.WARNING, "resume(): %s; continuing without identity", exc)
                return using_identity(None)
        return using_identity(identity)

    def record_span(
        self,
        name: str,
        *,
        start_time_ns: int,
        end_time_ns: int,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Record work timed elsewhere as a span with exactly these start and end times.

        The span is a child of the current span and carries the current
        identity. Times are integer nanoseconds since the epoch
        (``time.time_ns()``). Impossible times (negative, end before start,
        values that look like seconds) are not recorded: they are counted as
        ``invalid`` and logged once per kind.
        """
        if self._provider is None:
            return
        problem = timing_problem(start_time_ns, end_time_ns)
        if problem is not None:
            self.counts.add("invalid")
            self._once.log(
                f"record_span:{problem}",
                logging.WARNING,
                "record_span(%r) not recorded: %s (start_time_ns=%r, end_time_ns=%r); pass time.time_ns() values",
                name,
                problem,
                start_time_ns,
                end_time_ns,
            )
            return
        if name.__class__ is not str or not name:
            name = self._span_name(name)
        span = self._start_span(name, self.clean_attributes(attributes) if attributes else None, int(start_time_ns))
        span.end(end_time=int(end_time_ns))

    # -- lifecycle and status ------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called: spans made now are not exported, :meth:`status` is final."""
        return self._closed

    @property
    def memory_exporter(self) -> BoundedMemorySpanExporter | None:
        """The in-memory exporter in use (primary, fallback or copy), else None."""
        chain = self._pipeline.chain
        destinations = chain.destinations if chain is not None else ()
        return next((n.destination for n in destinations if isinstance(n.destination, BoundedMemorySpanExporter)), None)

    @property
    def pipeline(self) -> Pipeline:
        """The export pipeline (destinations, chain, queue, processor, sampler); without a chain when disabled.

        Internal: for the package's tools and tests, with no stable API.
        """
        return self._pipeline

    def rl_insight_probe(self, *, initialize: bool = False) -> Probe | None:
        """Check RL-Insight as the exporter does (None when this bridge does not want RL-Insight).

        With ``initialize``, also runs ``rl_insight.init`` once per process if it is usable.
        """
        rl_insight = self._pipeline.rl_insight
        return rl_insight.probe(initialize=initialize) if rl_insight is not None else None

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every span ended so far; False if that took longer than ``timeout_s``."""
        if self._provider is None:
            return True
        return self._provider.force_flush(int(timeout_s * 1000))

    def flush_queued(self, timeout_s: float = 5.0, *, wait_for_network: bool = True) -> bool:
        """Wait until the spans ended so far are exported by the export thread (at most ``timeout_s``);
        False on timeout.

        Lighter than :meth:`force_flush` (for the end of a unit of work, e.g. verl's
        ``generate_sequences``): sessions held for sampling stay held, the spill is not
        drained and no exporter's own flush runs. With ``wait_for_network=False``, when
        spans go over the network (``otlp``, RL-Insight), only until the export thread
        has taken them: the caller does not wait for a slow or unreachable server.
        """
        if self._processor is None:
            return True
        return self._processor.flush_queued(timeout_s, wait_for_network=wait_for_network)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush (at most ``timeout_s``, default the config's ``shutdown_timeout_s``) and stop.

        Logs one summary line: INFO, or WARNING if spans were dropped, failed,
        or went to the fallback because RL-Insight was unusable. Idempotent: a
        call while another thread shuts the bridge down (SIGTERM's) waits for it,
        at most ``timeout_s``.
        """
        timeout_s = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        if self._closed:
            if threading.current_thread() is not self._closing_thread:
                self._shut_down.wait(timeout_s)
            return
        self._closed = True
        self._closing_thread = threading.current_thread()
        try:
            if self._provider is None or self._processor is None:
                self._pipeline.shutdown(0.0)
                return
            deadline = time.monotonic() + timeout_s
            self._inflight.close(timeout_s)  # ends the sessions still open, so they are exported below
            self._identity_processor.shutdown()
            self._pipeline.shutdown(max(0.0, deadline - time.monotonic()))
            if self._owns_provider:
                self._provider.shutdown()
            self._pipeline.log_summary(self.status())
        finally:
            # Only now: an interpreter exit (or a multiprocessing child's) while another thread
            # shuts down (SIGTERM's) waits for it here.
            atexit.unregister(self._at_exit)
            if self._mp_exit is not None:
                self._mp_exit.cancel()
            if self._sigterm is not None:
                self._sigterm.close()
            self._shut_down.set()

    def status(self) -> BridgeStatus:
        """Where spans go and why, every destination with the spans it received, what is pending and where
        to, the spill, the open sessions and the counters (see :class:`~verl_otel_bridge.BridgeStatus`).

        A ``dict`` for programs; ``print(bridge.status())`` shows it as a few readable lines.
        """
        return printable(self._pipeline.status(self.counts.snapshot(), self._inflight.snapshot()))

    # -- internals -----------------------------------------------------------

    def clean_attributes(self, attributes: Mapping[Any, Any]) -> dict[str, AttributeValue]:
        """``attributes`` converted as this bridge's spans convert them (see ``attributes.py``)."""
        return clean_attributes(attributes, self._max_attribute_length, self._on_convert, self._max_attribute_items)

    def _start_stamped(
        self, name: str, attributes: Mapping[str, AttributeValue] | None, start_time: int | None = None
    ) -> Span:
        # On a provider the application owns, its processors may come before the bridge's:
        # the span is created with the identity, as any span with its attributes.
        identity = current_identity()
        if identity is not None:
            attributes = {**attributes, **identity.attributes} if attributes else identity.attributes
        return self.tracer.start_span(name, start_time=start_time, attributes=attributes)

    def note_bad_value(self, key: str, message: str, *args: object) -> None:
        """Count a value that had to be converted (``converted``), and log ``message`` once per ``key``."""
        self.counts.add("converted")
        self._once.log(key, logging.WARNING, message, *args)

    def note_status(self, status: str) -> None:
        """Warn once per value when a session's or task's ``status`` is not one the protocol names (it is kept)."""
        if status.lower() not in KNOWN_STATUSES:
            self._once.log(
                f"status:{status}",
                logging.WARNING,
                "status %r is not one the span protocol names (%s).%s It is kept as given; this is said once per value",
                status,
                ", ".join(KNOWN_STATUSES),
                did_you_mean(status, KNOWN_STATUSES),
            )

    def _note_conversion(self, kind: str, key: str) -> None:
        self.counts.add("converted")
        self._once.log(
            f"convert:{kind}:{key}",
            logging.INFO if kind in ("mapping", "bytes") else logging.WARNING,
            "attribute %r: %s value converted so it is not dropped (see verl_otel_bridge._internal.attributes)",
            key,
            kind,
        )

    def _note_lost_identity(self, name: str) -> None:
        self.counts.add(IDENTITY_LOST)
        self._once.log(
            "identity-lost",
            logging.WARNING,
            "span %r started outside any session, under a span that is in one: the thread it runs in was not "
            "handed the session's context, so it carries no identity (counted as identity_lost); call "
            "verl_otel_bridge.propagate_to_threads() once, or hand the work over with contextvars.copy_context().run",
            name,
        )

    def _span_name(self, name: Any) -> str:
        text = to_text(name) if name is not None else ""
        if not text:
            self._once.log("empty-name", logging.WARNING, "span with an empty or None name recorded as 'unnamed'")
            return "unnamed"
        return text

    def _at_exit(self) -> None:
        try:
            self.shutdown()
        except Exception:
            logger.exception("shutting down the bridge at exit failed")


def _own_tracer(provider: TracerProvider, processors: SpanProcessor) -> Tracer:
    """The bridge's tracer on ``provider``, also when ``OTEL_SDK_DISABLED`` made it hand out no-op tracers.

    The SDK reads that variable by itself; the config already did, and ``enabled=True``
    (or ``environ={}``) overrode it. Then the tracer the provider would have made is
    built from its public parts, over the bridge's processors (which the provider also
    holds, so its flush and shutdown still reach them).
    """
    tracer = provider.get_tracer("verl_otel_bridge", __version__)
    if not isinstance(tracer, NoOpTracer):
        return tracer
    chain = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    chain.add_span_processor(processors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the constructor still wants an InstrumentationInfo
        info = InstrumentationInfo("verl_otel_bridge", __version__)
    return SdkTracer(
        provider.sampler,
        provider.resource,
        chain,
        provider.id_generator,
        info,
        SpanLimits(),
        InstrumentationScope("verl_otel_bridge", __version__),
    )


def _sigterm_hooks(ref: weakref.ref[Bridge]) -> tuple[Callable[[bool], object], Callable[[], bool]]:
    """What SIGTERM calls: flush the bridge within its ``shutdown_timeout_s`` (shut it down when the
    process is about to die, or wait for the shutdown another thread began); and whether it is still running."""

    def flush(final: bool) -> object:
        bridge = ref()
        if bridge is None:
            return None
        if final or bridge._closed:
            bridge.shutdown()
            return None
        return bridge.force_flush(bridge.config.shutdown_timeout_s)

    def alive() -> bool:
        bridge = ref()
        return bridge is not None and not bridge._closed

    return flush, alive


def _shut_down_at_multiprocessing_exit(bridge: Bridge) -> None:
    """In a multiprocessing child, also shut ``bridge`` down in multiprocessing's exit hook.

    ``fork``/``forkserver`` children end with ``os._exit``, which skips ``atexit``;
    this hook runs after the child's target returns or raises. Called when the
    bridge is made and, through ``register_after_fork``, in every child forked after.
    """
    if multiprocessing.parent_process() is not None and not bridge._closed:
        bridge._mp_exit = multiprocessing.util.Finalize(None, bridge._at_exit, exitpriority=100)
