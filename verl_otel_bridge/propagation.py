"""One trace and one session identity across processes (Ray actors, multiprocessing workers).

The sender packs the current span and session identity into a plain dict, the
receiver continues both for a block::

    # driver
    with vob.session(sample=0, session=0, global_steps=3):
        carrier = propagation.inject()              # {"traceparent": ..., "verl-otel-bridge-identity": ...}
        ray.get(worker.run.remote(prompt, carrier))

    # inside the actor (or a multiprocessing child)
    def run(self, prompt, carrier):
        with propagation.attach(carrier, flush=True):
            with vob.turn(0):                       # child of the driver's span, carries its identity
                ...

The carrier is a ``dict[str, str]``: picklable, JSON-able, usable as HTTP
headers. It holds the W3C ``traceparent``/``tracestate`` of the current span
(written by OpenTelemetry's ``TraceContextTextMapPropagator`` itself, not the
global propagator, so an application's ``OTEL_PROPAGATORS`` cannot change it)
and, under :data:`IDENTITY_KEY`, the JSON of the current
:meth:`SessionIdentity.to_dict() <verl_otel_bridge.SessionIdentity.to_dict>`.

Worker processes need no ``configure()`` call: the first span builds a bridge
from ``VERL_OTEL_BRIDGE_*`` (and ``VERL_RL_INSIGHT_ENABLE``,
``RL_INSIGHT_SERVER_URL``) in the worker's environment, e.g. from Ray's
``runtime_env={"env_vars": ...}``. See ``docs/ray.md``.

Spans are exported in the background, so a worker that is killed loses what is
still queued. What survives which exit, and the tools here for the rest:

* ``attach(carrier, flush=True)`` exports every span ended so far before the
  block returns (a Ray method's caller then has its spans exported by the time
  it has the result);
* :func:`flush_on_exit` (called by :func:`attach`) flushes a multiprocessing
  child at its end: ``fork``/``forkserver`` children leave through
  ``os._exit`` and never run ``atexit``;
* :func:`flush_actors` flushes Ray actors from the driver, e.g. just before
  ``ray.shutdown()``, which (like ``ray.kill``) ends actors without ``atexit``.
"""

from verl_otel_bridge._internal.propagation import (
    DEFAULT_FLUSH_TIMEOUT_S,
    IDENTITY_KEY,
    TRACEPARENT_KEY,
    TRACESTATE_KEY,
    attach,
    flush_actors,
    flush_on_exit,
    inject,
)

__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "IDENTITY_KEY",
    "TRACEPARENT_KEY",
    "TRACESTATE_KEY",
    "attach",
    "flush_actors",
    "flush_on_exit",
    "inject",
]
