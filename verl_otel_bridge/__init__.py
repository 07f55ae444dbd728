"""verl-otel-bridge: OpenTelemetry spans for RL agent loops, exported to RL-Insight or locally.

Quick start::

    import verl_otel_bridge as vob

    vob.configure(project="demo", experiment_name="exp1")
    with vob.session(sample=0, session=0, global_steps=3) as s:
        with vob.span("generate", prompt_tokens=12):
            ...
    print(vob.status())
"""

from verl_otel_bridge._version import __version__
from verl_otel_bridge.bridge import Bridge
from verl_otel_bridge.config import BridgeConfig, ConfigError
from verl_otel_bridge.current import (
    configure,
    force_flush,
    get_bridge,
    instrument,
    record_span,
    resume,
    session,
    set_bridge,
    shutdown,
    span,
    status,
    task,
    traced,
    turn,
)
from verl_otel_bridge.identity import SessionIdentity, current_identity
from verl_otel_bridge.payload import record_io
from verl_otel_bridge.session import Session
from verl_otel_bridge.status import BridgeStatus

__all__ = [
    "Bridge",
    "BridgeConfig",
    "BridgeStatus",
    "ConfigError",
    "Session",
    "SessionIdentity",
    "__version__",
    "configure",
    "current_identity",
    "force_flush",
    "get_bridge",
    "instrument",
    "record_io",
    "record_span",
    "resume",
    "session",
    "set_bridge",
    "shutdown",
    "span",
    "status",
    "task",
    "traced",
    "turn",
]
