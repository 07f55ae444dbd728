"""``record_io``: what a session, task, turn or tool was given and what it produced.

The values go on the span as ``input`` and ``output`` (converted like any
attribute: a dict becomes JSON). Destinations that speak the generic vocabulary
(``otlp``, ``console``) send them as ``input.value`` / ``output.value``, as
``gen_ai.input.messages`` / ``gen_ai.output.messages`` on generate turns and as
``gen_ai.tool.call.result`` on tool turns (see
:mod:`verl_otel_bridge._internal.exporters.vocabulary`).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from verl_otel_bridge._internal.attributes import clean_attributes, set_clean_attributes
from verl_otel_bridge._internal.current import current_bridge
from verl_otel_bridge._internal.protocol import INPUT, OUTPUT


def record_io(*, input: Any = None, output: Any = None, span: Span | None = None) -> None:
    """Set ``input`` and/or ``output`` on ``span`` (default: the current span); None leaves one unset.

    Inside ``with vob.session(...) as s:`` the current span is the session's (pass
    ``span=s.span`` from deeper down); inside ``turn(...)`` it is the turn's. Never raises.
    """
    target = span if span is not None else trace.get_current_span()
    values = {key: value for key, value in ((INPUT, input), (OUTPUT, output)) if value is not None}
    if values and target.is_recording():
        bridge = current_bridge()  # its conversion settings; no bridge is built for this
        set_clean_attributes(
            target, bridge.clean_attributes(values) if bridge is not None else clean_attributes(values)
        )
