"""The current bridge: the one process-wide slot, and the shortcuts that use it."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, overload

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span

from verl_otel_bridge._internal.agent_loop import TaskHandle, TurnHandle
from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.config import PRIVACY_KEYS, BridgeConfig, ConfigError, resolve_leniently
from verl_otel_bridge._internal.exporters.jsonl import opened_on_first_export
from verl_otel_bridge._internal.identity import IdentityFields, SessionIdentity
from verl_otel_bridge._internal.session import Session
from verl_otel_bridge._internal.spans import traced_by
from verl_otel_bridge._internal.status import BridgeStatus

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_current: Bridge | None = None
_lock = threading.Lock()


def configure(config: Mapping[str, Any] | BridgeConfig | None = None, /, **overrides: Any) -> Bridge:
    """Create the bridge every shortcut uses, replacing (flushing and shutting down) the previous one.

    ``config`` is a mapping (a YAML or OmegaConf section works) or a
    :class:`BridgeConfig`; keyword ``overrides`` win over it, it wins over
    ``VERL_OTEL_BRIDGE_*`` and the other environment variables, and those over
    the defaults. The bridge has a ``TracerProvider`` of its own: a global
    provider the application set is left alone.

    Raises:
        ValueError: an unknown key or a bad value, naming the key and the fix.
    """
    return _make_current(Bridge(BridgeConfig.resolve(config, **overrides)))


def instrument(
    provider: TracerProvider, config: Mapping[str, Any] | BridgeConfig | None = None, /, **overrides: Any
) -> Bridge:
    """Add the bridge's identity stamping and exporters to a ``TracerProvider`` the application owns.

    Spans from every tracer of ``provider`` (other instrumented libraries
    included) then carry the session identity and go where the bridge's config
    says, besides the provider's own processors. The returned bridge becomes the
    current one, as with :func:`configure`; its shutdown leaves ``provider`` running.

    Raises:
        ValueError: as :func:`configure`.
    """
    return _make_current(Bridge(BridgeConfig.resolve(config, **overrides), provider=provider))


def _make_current(bridge: Bridge) -> Bridge:
    previous = set_bridge(bridge)
    if previous is not None:
        previous.shutdown()
    return bridge


def get_bridge() -> Bridge:
    """The current bridge; the first call without ``configure()`` (or after :func:`shutdown`) builds one
    from the environment. A bridge shut down otherwise (at exit, by SIGTERM, ``bridge.shutdown()``) stays
    current: spans made after it are not exported, and no new bridge is made while the process ends.

    A bad environment variable is logged as an error and the defaults are used,
    since this runs where spans are made and must not raise there.
    """
    global _current
    bridge = _current
    if bridge is not None and not bridge.retired:
        return bridge
    with _lock:
        if _current is None or _current.retired:
            _current = _from_environment()
        assert _current is not None
        return _current


def current_bridge() -> Bridge | None:
    """The current bridge, or None if there is none yet or :func:`shutdown` retired it (never builds one)."""
    bridge = _current
    return bridge if bridge is not None and not bridge.retired else None


def set_bridge(bridge: Bridge | None) -> Bridge | None:
    """Make ``bridge`` current without shutting anything down; returns the previous one.

    For fixtures that swap a bridge in and restore the old one afterwards.
    """
    global _current
    with _lock:
        previous, _current = _current, bridge
    return previous


def _from_environment() -> Bridge:
    """A bridge from the environment that never raises: each unusable setting is left out alone."""
    config, problems = resolve_leniently()
    for problem in problems:
        logger.error("%s; that setting is ignored, the others apply.", str(problem).rstrip("."))
    known = BridgeConfig.keys()
    for _ in known:
        try:
            with opened_on_first_export():  # made by a span: the caller's thread never waits on a file
                return Bridge(config)
        except ValueError as exc:  # e.g. a jsonl_path that cannot be opened
            key = exc.key if isinstance(exc, ConfigError) else None
            if key is None or key in PRIVACY_KEYS:
                logger.error("%s; nothing is exported by this bridge.", str(exc).rstrip("."))
                return Bridge(BridgeConfig(enabled=False))
            logger.error("%s; %s is left at its default, the other settings apply.", str(exc).rstrip("."), key)
            config = dataclasses.replace(config, **{key: getattr(BridgeConfig, key)})
    return Bridge(BridgeConfig(enabled=False))


def _shortcut_of(method: Callable[..., Any]) -> Callable[[F], F]:
    """Give a module-level shortcut its method's documentation, after the shortcut's own first line.

    The method's docstring is the one place each behaviour is described; ``help(vob.session)``
    shows it whole.
    """

    def document(shortcut: F) -> F:
        own = inspect.cleandoc(shortcut.__doc__ or "")
        shortcut.__doc__ = f"{own}\n\n{inspect.cleandoc(method.__doc__ or '')}"
        return shortcut

    return document


@_shortcut_of(Bridge.session)
def session(*, state_lane_id: str | None = None, **identity: Unpack[IdentityFields]) -> AbstractContextManager[Session]:
    """``get_bridge().session(...)``: a session on the current bridge (built from the environment if none)."""
    return get_bridge().session(state_lane_id=state_lane_id, **identity)


@_shortcut_of(Bridge.span)
def span(name: str, /, **attributes: Any) -> AbstractContextManager[Span]:
    """``get_bridge().span(...)``: a span on the current bridge, carrying the current session's identity."""
    return get_bridge().span(name, **attributes)


@_shortcut_of(Bridge.task)
def task(name: str, /, **attributes: Any) -> AbstractContextManager[TaskHandle]:
    """``get_bridge().task(...)``: an agent task in the current session, on the current bridge."""
    return get_bridge().task(name, **attributes)


@_shortcut_of(Bridge.turn)
def turn(turn: int, /, *, type: str = "generate", **attributes: Any) -> AbstractContextManager[TurnHandle]:
    """``get_bridge().turn(...)``: one turn of the current session, on the current bridge."""
    return get_bridge().turn(turn, type=type, **attributes)


@_shortcut_of(Bridge.resume)
def resume(identity: SessionIdentity | Mapping[str, Any]) -> AbstractContextManager[SessionIdentity | None]:
    """``get_bridge().resume(...)``: a session's identity continued on the current bridge."""
    return get_bridge().resume(identity)


@overload
def traced(name: F, /) -> F: ...


@overload
def traced(name: str | None = None, /, **attributes: Any) -> Callable[[F], F]: ...


@_shortcut_of(Bridge.traced)
def traced(name: Any = None, /, **attributes: Any) -> Any:
    """Like :meth:`Bridge.traced`, but uses whichever bridge is current at each call."""
    return traced_by(get_bridge, name, attributes)


@_shortcut_of(Bridge.record_span)
def record_span(
    name: str, *, start_time_ns: int, end_time_ns: int, attributes: Mapping[str, Any] | None = None
) -> None:
    """``get_bridge().record_span(...)``: work timed elsewhere, recorded on the current bridge."""
    get_bridge().record_span(name, start_time_ns=start_time_ns, end_time_ns=end_time_ns, attributes=attributes)


def force_flush(timeout_s: float = 30.0) -> bool:
    """Flush the current bridge (if any)."""
    bridge = _current
    return bridge.force_flush(timeout_s) if bridge is not None else True


@_shortcut_of(Bridge.status)
def status() -> BridgeStatus:
    """The current bridge's account of where spans went; after :func:`shutdown`, that bridge's final one
    (``shut_down`` true) until another is configured or made by a span."""
    bridge = _current
    return (bridge if bridge is not None else get_bridge()).status()


def shutdown(timeout_s: float | None = None) -> None:
    """Shut the current bridge down; it stays for :func:`status` (its final account), and the next span
    or :func:`configure` makes a new one."""
    bridge = _current
    if bridge is not None:
        bridge.shutdown(timeout_s)
        bridge.retired = True
