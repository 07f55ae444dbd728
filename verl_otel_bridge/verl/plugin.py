"""The ``verl.plugins`` entry point: ``import verl`` imports this module in every process.

It imports no verl module and does nothing costly: it registers post-import
hooks (``wrapt``) that patch verl's agent-loop methods when verl itself imports
them (:mod:`verl_otel_bridge._internal.verl.tracing`, and for the trainer's steps
:mod:`verl_otel_bridge._internal.verl.trainer`). Whether anything is traced is
decided per trajectory: verl's rollout-trace backend is ``otel``
(``actor_rollout_ref.rollout.trace.backend=otel``), or :data:`SWITCH_ENV` says so.

verl logs a plugin that raises at DEBUG only, so this module says its own
problems at WARNING and never raises.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType

from verl_otel_bridge._internal.verl.switch import BACKEND, SWITCH_ENV
from verl_otel_bridge._version import install_command

logger = logging.getLogger(__name__)

__all__ = ["BACKEND", "HOOKS", "RUN_HOOKS", "SWITCH_ENV", "TRAINER_HOOKS", "register"]

#: verl module -> the function of :mod:`verl_otel_bridge._internal.verl.tracing` that wraps it.
HOOKS = {
    "verl.utils.rollout_trace": "install_rollout_trace",
    "verl.experimental.agent_loop.agent_loop": "install_agent_loop",
    "verl.experimental.agent_loop.tool_agent_loop": "install_tool_agent_loop",
    "verl.workers.rollout.llm_server": "install_llm_server",
}
#: verl module -> the function of :mod:`verl_otel_bridge._internal.verl.trainer` that wraps it (one trace per step).
TRAINER_HOOKS = {
    "verl.trainer.ppo.ray_trainer": "install_ray_trainer",
    "verl.utils.tracking": "install_tracking",
}

#: verl module -> the function of :mod:`verl_otel_bridge._internal.verl.runs` that wraps it (the run's name).
RUN_HOOKS = {"verl.trainer.constants_ppo": "install_runtime_env"}


def _hook(installer: str, owner: str = "verl_otel_bridge._internal.verl.tracing") -> Callable[[ModuleType], None]:
    def install(module: ModuleType) -> None:
        try:
            getattr(importlib.import_module(owner), installer)(module)
        except Exception:
            logger.warning("verl_otel_bridge: wrapping %s failed; it is not traced", module.__name__, exc_info=True)

    return install


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
    for module, installer in HOOKS.items():
        wrapt.register_post_import_hook(_hook(installer), module)
    for module, installer in TRAINER_HOOKS.items():
        wrapt.register_post_import_hook(_hook(installer, "verl_otel_bridge._internal.verl.trainer"), module)
    for module, installer in RUN_HOOKS.items():
        wrapt.register_post_import_hook(_hook(installer, "verl_otel_bridge._internal.verl.runs"), module)
    return True


try:
    register()
except Exception:
    logger.warning("verl_otel_bridge: registering the verl plugin failed; nothing is traced", exc_info=True)
