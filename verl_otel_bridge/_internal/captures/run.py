"""The run folder's name: the same in every process of a run, on every node, and new for each run.

In order:

1. ``capture_run`` (``VERL_OTEL_BRIDGE_CAPTURE_RUN``) when set. verl's driver sets it
   for the whole run: the plugin adds it to the Ray runtime env verl starts Ray with
   (``verl.trainer.constants_ppo.get_ppo_ray_runtime_env``), so every worker of every
   node gets the driver's name; see :func:`new_run_name`.
2. In a Ray worker without it (a driver that started Ray itself): the experiment and
   Ray's job id, which every worker of the job shares on every node.
3. Otherwise (no Ray): the experiment, this process's start time and a random part:
   the process is the run.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

from verl_otel_bridge._internal.captures.layout import STEP_KEY, safe_name
from verl_otel_bridge._internal.config import BridgeConfig

#: When this process loaded the bridge, and a random part: with the pid they tell processes and restarts apart.
_STARTED = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
_RANDOM = secrets.token_hex(4)


def new_run_name(experiment: str | None) -> str:
    """A new run's name: ``<experiment>-<UTC start>-<random>`` (what verl's driver hands its workers)."""
    started = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{safe_name(experiment or '', 'run', 60)}-{started}-{secrets.token_hex(4)}"


def run_name(configured: str | None, experiment: str | None) -> str:
    """This process's run folder name (see the module docstring)."""
    if configured:
        return safe_name(configured, "run")
    prefix = safe_name(experiment or "", "run", 60)
    job = ray_job_id()
    if job is not None:
        return f"{prefix}-ray-job-{safe_name(job, 'job', 40)}"
    return f"{prefix}-{_STARTED}-{_RANDOM}"


def ray_job_id() -> str | None:
    """Ray's job id when this process is a connected Ray worker or driver (Ray is never imported here)."""
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return None
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - an odd Ray: a run per process instead
        return None
    return str(job) if job else None


def run_folder(config: BridgeConfig) -> Path:
    """The run folder ``config`` writes into: ``capture_dir/<run>`` (``capture_dir`` must be set)."""
    return Path(config.capture_dir or ".").expanduser() / run_name(config.capture_run, config.experiment_name)


def where(config: BridgeConfig) -> str:
    """Where ``config``'s ``jsonl`` exporter writes, in words."""
    if config.capture_dir is None:
        return f"JSON Lines to {config.jsonl_path}"
    return f"gzip JSON Lines in {run_folder(config)}/{STEP_KEY}=<n>/"
