"""verl-otel-bridge: OpenTelemetry spans for RL agent loops, exported to RL-Insight or locally.

Quick start::

    import verl_otel_bridge as vob

    vob.configure(project="demo", experiment_name="exp1")
    with vob.session(sample=0, session=0, global_steps=3) as s:
        with vob.span("generate", prompt_tokens=12):
            ...
    print(vob.status())
"""

from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.config import BridgeConfig, ConfigError
from verl_otel_bridge._internal.current import (
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
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity
from verl_otel_bridge._internal.moved import install as _answer_moved_modules
from verl_otel_bridge._internal.payload import record_io
from verl_otel_bridge._internal.session import Session
from verl_otel_bridge._internal.status import BridgeStatus
from verl_otel_bridge._internal.threads import propagate_to_threads
from verl_otel_bridge._version import __version__

_answer_moved_modules()

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
    "propagate_to_threads",
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
