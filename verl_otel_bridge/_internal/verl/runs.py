"""verl's driver names the run for all its workers: the capture run folder every process of a run shares.

verl's ``main_ppo`` starts Ray with the runtime env ``get_ppo_ray_runtime_env(config)``
returns (merged with ``ray_kwargs.ray_init.runtime_env``), which every worker of the
job on every node gets. With tracing wanted (the plugin's switch), the plugin adds
``VERL_OTEL_BRIDGE_CAPTURE_RUN=<experiment>-<UTC start>-<random>`` to it, unless the
driver's environment already sets it: so all processes of one launch write into one
run folder, and each launch into a new one (docs/protocol.md#capture-directories).
A value the user puts in ``ray_kwargs.ray_init.runtime_env`` wins (verl merges it last).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from verl_otel_bridge._internal.captures.run import new_run_name
from verl_otel_bridge._internal.config import ENV_PREFIX
from verl_otel_bridge._internal.verl.tracing import wanted
from verl_otel_bridge._internal.verl.wrapping import PATCHED, warn

#: The variable that names the run folder (the bridge key ``capture_run``).
CAPTURE_RUN_ENV = f"{ENV_PREFIX}CAPTURE_RUN"


def runtime_env(original: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    """The wrapper of ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env`` (a row of the target table),
    installed before ``main_ppo`` imports it by name: :func:`with_run_name`."""
    return with_run_name(original)


def with_run_name(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` whose runtime env also names the run (see the module docstring); never raises more than it."""

    @functools.wraps(original)
    def get_ppo_ray_runtime_env(config: Any = None, *args: Any, **kwargs: Any) -> Any:
        runtime_env = original(config, *args, **kwargs)
        try:
            trace = config.actor_rollout_ref.rollout.trace if config is not None else None
            if wanted(trace.get("backend") if trace is not None else None) and CAPTURE_RUN_ENV not in os.environ:
                experiment = config.trainer.get("experiment_name") if config is not None else None
                runtime_env.setdefault("env_vars", {})[CAPTURE_RUN_ENV] = new_run_name(experiment)
        except Exception as exc:  # noqa: BLE001 - verl starts Ray as it would without the plugin
            warn("naming the run for the workers", exc)
        return runtime_env

    setattr(get_ppo_ray_runtime_env, PATCHED, True)
    return get_ppo_ray_runtime_env
