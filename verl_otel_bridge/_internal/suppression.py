"""The bridge's own threads, marked so that instrumented libraries do not trace what they do.

OpenTelemetry's span processors attach the suppress-instrumentation context key
around every export; instrumentations (urllib3, requests, grpc, ...) then make
no spans for the exporter's requests. Without it, with ``instrument(provider)``
and an instrumented HTTP library on the same provider, each batch the bridge
posts would make spans that are exported in the next batch, and so on.
"""

from __future__ import annotations

from opentelemetry import context

# As opentelemetry-instrumentation's public ``suppress_instrumentation()`` (not a
# runtime dependency): the API's key, which the SDK's processors set and current
# instrumentations check, and the plain string older instrumentations check.
_KEYS = (context._SUPPRESS_INSTRUMENTATION_KEY, "suppress_instrumentation")


def suppress_instrumentation_in_this_thread() -> None:
    """Set the suppress-instrumentation key for the rest of the calling thread's life.

    Only for threads the bridge starts and owns (the export worker, the gauge
    publisher): a thread starts with an empty context, so the key, attached once
    at its start and never detached, covers every exporter call made there.
    """
    current = context.get_current()
    for key in _KEYS:
        current = context.set_value(key, True, current)
    context.attach(current)
