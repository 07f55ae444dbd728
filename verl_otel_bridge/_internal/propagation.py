"""Carriers of one trace and one session identity across processes: see :mod:`verl_otel_bridge.propagation`."""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.util
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from verl_otel_bridge._internal import current
from verl_otel_bridge._internal.attributes import to_attribute_value
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity, using_identity
from verl_otel_bridge._internal.logs import OnceLogger

logger = logging.getLogger(__name__)

#: Carrier key of the W3C trace context (``00-<trace id>-<span id>-<flags>``).
TRACEPARENT_KEY = "traceparent"
#: Carrier key of the W3C vendor trace state (only present when not empty).
TRACESTATE_KEY = "tracestate"
#: Carrier key of the session identity: ``json.dumps(SessionIdentity.to_dict())``.
#: Lowercase with hyphens so the carrier also works as HTTP headers.
IDENTITY_KEY = "verl-otel-bridge-identity"

#: Default bound of the flush done by ``attach(..., flush=True)``.
DEFAULT_FLUSH_TIMEOUT_S = 5.0

#: ``multiprocessing.util.Finalize`` priority of :func:`flush_on_exit` (higher runs
#: earlier; multiprocessing's own pools and queues use 15 and below).
_FINALIZER_PRIORITY = 100

_PROPAGATOR = TraceContextTextMapPropagator()
_once = OnceLogger(logger)
_finalizer_lock = threading.Lock()
_finalizer_pid: int | None = None


def inject() -> dict[str, str]:
    """The current trace context and session identity as a plain, picklable ``dict[str, str]``.

    Keys: :data:`TRACEPARENT_KEY` (and :data:`TRACESTATE_KEY`) when a span is
    current, :data:`IDENTITY_KEY` when a session identity is current. Outside
    any span and session the carrier is ``{}`` (:func:`attach` then runs its
    block with neither). Never raises: a problem is logged once and the part
    that failed is left out.
    """
    carrier: dict[str, str] = {}
    try:
        _PROPAGATOR.inject(carrier)
    except Exception as exc:  # noqa: BLE001 - instrumentation must not break the caller
        _once.log("inject:trace", logging.WARNING, "inject(): trace context left out: %r", exc)
        carrier.pop(TRACEPARENT_KEY, None)
        carrier.pop(TRACESTATE_KEY, None)
    identity = current_identity()
    if identity is not None:
        try:
            carrier[IDENTITY_KEY] = json.dumps(
                identity.to_dict(), separators=(",", ":"), ensure_ascii=False, default=_json_value
            )
        except Exception as exc:  # noqa: BLE001
            _once.log("inject:identity", logging.WARNING, "inject(): session identity left out: %r", exc)
    return carrier


@contextmanager
def attach(
    carrier: Mapping[str, str] | None,
    *,
    flush: bool = False,
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
) -> Iterator[SessionIdentity | None]:
    """Continue the sender's trace and session identity for the block; yields the identity (or None).

    Spans started inside (at any depth, and in asyncio tasks created inside)
    are children of the span that was current at :func:`inject` and carry its
    session identity. The block runs exactly in the sender's state: what the
    carrier lacks is absent inside (no trace context: spans start new traces;
    no identity: spans carry none), whatever the receiver had current before.

    A ``None``, empty or malformed carrier (wrong type, a bad ``traceparent``,
    identity JSON that does not parse or whose keys disagree) never raises: the
    problem is logged once per kind and the block runs without the part that
    could not be read.

    Args:
        carrier: what :func:`inject` returned in the sender (after any pickling
            or JSON round trip).
        flush: on leaving the block, also when it raised, wait until every span
            ended so far in this process has been exported (at most
            ``flush_timeout_s``). Costs one export round trip; use it on the
            outermost ``attach`` of a Ray remote method so nothing the method
            recorded is lost if the actor is killed after returning. Do not
            use it per coroutine inside a busy asyncio loop: the wait blocks
            the loop.
        flush_timeout_s: bound of that wait, in seconds.

    Also registers :func:`flush_on_exit` when this process is a
    multiprocessing child.
    """
    flush_on_exit()
    context, identity = _read(carrier)
    token = otel_context.attach(context)
    try:
        with using_identity(identity):
            yield identity
    finally:
        try:
            otel_context.detach(token)
        finally:
            if flush:
                _flush("attach", flush_timeout_s)


def flush_on_exit() -> bool:
    """Flush the current bridge when this multiprocessing child process ends; True if registered.

    ``multiprocessing`` children started by ``fork`` or ``forkserver`` end with
    ``os._exit``, which skips ``atexit`` and with it the bridge's own shutdown:
    whatever was still queued for export would be lost. This registers a
    ``multiprocessing.util.Finalize`` callback, which the child runs after its
    target returns or raises (also for ``spawn`` children and for ``Pool`` /
    ``ProcessPoolExecutor`` workers that are closed normally). It flushes the
    bridge that is current then, bounded by its ``shutdown_timeout_s``.

    Idempotent and cheap (one comparison after the first call per process);
    returns False, registering nothing, in a process that is not a
    multiprocessing child (the bridge's ``atexit`` hook covers those). A
    terminated or killed child (``Process.terminate()``, ``Pool.terminate()``,
    leaving a ``with Pool()`` block) still loses its queued spans.
    """
    global _finalizer_pid
    pid = os.getpid()
    if _finalizer_pid == pid:
        return True
    if multiprocessing.parent_process() is None:
        return False
    with _finalizer_lock:
        if _finalizer_pid != pid:
            multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=_FINALIZER_PRIORITY)
            _finalizer_pid = pid
    return True


def flush_actors(actors: Iterable[Any], *, timeout_s: float = 30.0) -> list[bool]:
    """From a Ray driver: flush the current bridge inside each of ``actors``; one bool per actor.

    Call it before ``ray.shutdown()`` (or ``ray.kill``): those end actor
    processes at once, without ``atexit``, so spans still queued there are lost.
    Runs ``verl_otel_bridge.force_flush()`` in each actor through
    ``actor.__ray_call__`` (a built-in method of every actor in recent Ray), all
    actors concurrently, waiting at most ``timeout_s`` in total. An entry is
    False when that actor's flush timed out, the actor is dead or busy beyond
    the timeout (calls queue behind running ones), or its handle has no
    ``__ray_call__``; nothing is raised.
    """
    import ray  # only drivers that already use Ray call this

    handles = list(actors)
    results = [False] * len(handles)
    pending: dict[Any, int] = {}
    for index, actor in enumerate(handles):
        try:
            pending[actor.__ray_call__.remote(_flush_in_actor, timeout_s)] = index
        except Exception as exc:  # noqa: BLE001 - an unusable handle is reported, not raised
            _once.log("flush_actors:call", logging.WARNING, "flush_actors(): cannot call into an actor: %r", exc)
    if not pending:
        return results
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    for ref in ready:
        try:
            results[pending[ref]] = bool(ray.get(ref, timeout=0))
        except Exception as exc:  # noqa: BLE001 - a dead actor is a False, not an error
            _once.log("flush_actors:get", logging.WARNING, "flush_actors(): an actor could not flush: %r", exc)
    if not all(results):
        logger.warning(
            "flush_actors(): %d of %d actors did not confirm a flush (dead, busy, or not done within %.1f s)",
            results.count(False),
            len(results),
            timeout_s,
        )
    return results


# -- internals ---------------------------------------------------------------


def _read(carrier: Any) -> tuple[otel_context.Context, SessionIdentity | None]:
    """The OpenTelemetry context and identity in ``carrier``; never raises."""
    empty = otel_context.Context()
    if carrier is None:
        _once.log("carrier:none", logging.INFO, "attach(None): the block runs without trace context and identity")
        return empty, None
    if not isinstance(carrier, Mapping):
        _once.log(
            "carrier:type",
            logging.WARNING,
            "attach(): the carrier is a %s, not the dict inject() returns; running without trace context and identity",
            type(carrier).__name__,
        )
        return empty, None
    try:
        fields = {key.lower(): value for key, value in carrier.items() if isinstance(key, str)}
    except Exception as exc:  # noqa: BLE001 - a mapping that cannot be read
        _once.log("carrier:read", logging.WARNING, "attach(): the carrier cannot be read (%r); running without it", exc)
        return empty, None
    if not fields:
        _once.log(
            "carrier:empty", logging.INFO, "attach(): empty carrier; the block runs without trace context and identity"
        )
        return empty, None
    return _read_trace(fields, empty), _read_identity(fields)


def _read_trace(fields: Mapping[str, Any], empty: otel_context.Context) -> otel_context.Context:
    traceparent = fields.get(TRACEPARENT_KEY)
    if traceparent is None:
        return empty
    headers = {TRACEPARENT_KEY: traceparent}
    tracestate = fields.get(TRACESTATE_KEY)
    if isinstance(tracestate, str):
        headers[TRACESTATE_KEY] = tracestate
    try:
        if not isinstance(traceparent, str):
            raise TypeError(f"traceparent is a {type(traceparent).__name__}, not a str")
        context = _PROPAGATOR.extract(headers, context=empty)
        if not trace.get_current_span(context).get_span_context().is_valid:
            raise ValueError(f"traceparent {traceparent[:80]!r} is not a W3C trace context")
    except Exception as exc:  # noqa: BLE001 - a bad carrier must not break the receiver
        _once.log("carrier:traceparent", logging.WARNING, "attach(): %s; spans inside start a new trace", exc)
        return empty
    return context


def _read_identity(fields: Mapping[str, Any]) -> SessionIdentity | None:
    raw = fields.get(IDENTITY_KEY)
    if raw is None:
        return None
    try:
        if not isinstance(raw, (str, bytes, bytearray)):
            raise TypeError(f"the identity is a {type(raw).__name__}, not JSON text")
        data = json.loads(raw)
        if not isinstance(data, Mapping):
            raise TypeError(f"the identity JSON is a {type(data).__name__}, not an object")
        return SessionIdentity.from_dict(data)
    except Exception as exc:  # noqa: BLE001 - ValueError, TypeError, JSONDecodeError, RecursionError...
        _once.log("carrier:identity", logging.WARNING, "attach(): identity not used: %s", exc)
        return None


def _json_value(value: Any) -> Any:
    """``json.dumps`` fallback for identity values that are not JSON types (e.g. numpy ints)."""
    converted = to_attribute_value(value)
    if converted is None or converted is value:
        return str(value)
    return converted


def _flush(reason: str, timeout_s: float) -> bool:
    try:
        done = current.force_flush(timeout_s)
    except Exception as exc:  # noqa: BLE001
        _once.log(f"flush:{reason}:error", logging.WARNING, "%s: flushing the bridge raised %r", reason, exc)
        return False
    if not done:
        _once.log(
            f"flush:{reason}:timeout",
            logging.WARNING,
            "%s: the bridge did not finish exporting within %.1f s; spans still queued may be lost if the process dies",
            reason,
            timeout_s,
        )
    return done


def _flush_at_exit() -> None:
    bridge = current.current_bridge()
    if bridge is not None:
        _flush("flush_on_exit", bridge.config.shutdown_timeout_s)


def _flush_in_actor(_actor: Any, timeout_s: float) -> bool:
    return _flush("flush_actors", timeout_s)
