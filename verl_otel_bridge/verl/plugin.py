"""The ``verl.plugins`` entry point: ``import verl`` imports this module in every process.

It imports no verl module and does nothing costly: it registers post-import
hooks (``wrapt``) that wrap verl's methods when verl itself imports their modules
(what is wrapped, and with what: :data:`verl_otel_bridge._internal.verl.targets.TARGETS`).
Whether anything is traced is decided per trajectory: verl's rollout-trace backend is ``otel``
(``actor_rollout_ref.rollout.trace.backend=otel``), or :data:`SWITCH_ENV` says so.

verl logs a plugin that raises at DEBUG only, so this module says its own
problems at WARNING and never raises.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from verl_otel_bridge._internal.verl.switch import BACKEND, SWITCH_ENV
from verl_otel_bridge._internal.verl.targets import MODULES
from verl_otel_bridge._version import install_command

logger = logging.getLogger(__name__)

__all__ = ["BACKEND", "SWITCH_ENV", "register"]

#: verl module -> the function of :mod:`verl_otel_bridge._internal.verl.runs` that wraps it (the run's name).
RUN_HOOKS = {"verl.trainer.constants_ppo": "install_runtime_env"}


def _install(module: ModuleType) -> None:
    """Wrap ``module``'s targets; the installer (and the bridge behind it) is imported then, not at ``import verl``."""
    try:
        importlib.import_module("verl_otel_bridge._internal.verl.install").install(module)
    except Exception:
        logger.warning("verl_otel_bridge: wrapping %s failed; it is not traced", module.__name__, exc_info=True)


def register() -> bool:
    """Register the post-import hooks (idempotent per process); False when ``wrapt`` is missing."""
    try:
        import wrapt
    except ImportError:
        logger.warning(
            "verl_otel_bridge: the verl plugin needs wrapt, which is not installed; verl's agent loops are "
            "not traced. Install it with: %s",
            install_command("verl"),
        )
        return False
    for module in MODULES:
        wrapt.register_post_import_hook(_install, module)
    return True


try:
    register()
except Exception:
    logger.warning("verl_otel_bridge: registering the verl plugin failed; nothing is traced", exc_info=True)
