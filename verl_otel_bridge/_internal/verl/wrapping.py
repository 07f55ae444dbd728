"""How the plugin replaces a verl method, and checks first that it is the method the plugin knows.

Shared by the wrappers of :mod:`.tracing`, :mod:`.trainer` and :mod:`.logger` and by the installer
(:mod:`.install`): :func:`patch`, :func:`recognised` (the version check, against the parameters
:data:`~verl_otel_bridge._internal.verl.targets.TARGETS` declares) and :func:`warn`, which says an
instrumentation failure once per kind.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.verl.targets import Target

logger = logging.getLogger(__name__)
_once = OnceLogger(logger)

#: What a :attr:`~verl_otel_bridge._internal.verl.targets.Kind.METHOD` target's wrapper is called with:
#: verl's original function, the instance, and the call's arguments.
Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

#: Set on each function the plugin put in verl's place (so nothing is wrapped twice).
PATCHED = "__verl_otel_bridge_patched__"


def warn(what: str, exc: Exception) -> None:
    """Log an instrumentation failure once per kind at WARNING (verl goes on as if unwrapped)."""
    _once.log(f"{what}:{type(exc).__name__}", logging.WARNING, "verl tracing: %s failed: %r", what, exc)


def resolve(module: ModuleType, name: str) -> Any:
    """What the dotted ``name`` (``function``, ``Class``, ``Class.method``) is in ``module``, or None if absent."""
    try:
        return functools.reduce(getattr, name.split("."), module)
    except AttributeError:
        return None


def recognised(module: ModuleType, target: Target) -> bool:
    """Whether ``module`` has ``target`` with the parameters its wrapper reads; if not, one WARNING
    (none for an optional target that is absent)."""
    found = resolve(module, target.name)
    if found is None and target.optional:
        return False
    try:
        parameters = inspect.signature(found).parameters if found is not None else None
    except (TypeError, ValueError):
        parameters = None
    missing = [p for p in target.parameters if parameters is None or p not in parameters]
    if parameters is None or missing:
        version = getattr(sys.modules.get("verl"), "__version__", "?")
        _once.log(
            f"unrecognised:{target.qualified_name}",
            logging.WARNING,
            "verl %s: %s.%s is not the method the verl plugin knows (missing %s); it is not traced",
            version,
            module.__name__,
            target.name,
            missing or "the method",
        )
        return False
    return True


def patch(owner: type, name: str, wrapper: Wrapper) -> None:
    """Replace ``owner.name`` by a plain function (a coroutine function for a coroutine function) calling
    ``wrapper(original, self, args, kwargs)``; a method already patched is left alone.

    A plain function with the original's ``__module__`` and ``__qualname__`` (not a ``wrapt``
    proxy): Ray pickles an actor class's methods by reference to that name, so an
    ``AgentLoopWorker`` actor runs the patched method of its own process.
    """
    original = vars(owner)[name]
    if getattr(original, PATCHED, False):
        return
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await wrapper(original, self, args, kwargs)

    else:

        @functools.wraps(original)
        def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(original, self, args, kwargs)

    setattr(patched, PATCHED, True)
    setattr(owner, name, patched)
