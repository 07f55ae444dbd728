"""Where the verl plugin's spans go when nothing says where: a run folder in :func:`default_dir`.

The plugin's workers build their bridge with :func:`worker_config`. It is
:func:`~verl_otel_bridge._internal.verl.config.bridge_config` except when no destination is configured, i.e.
none of these is set: the bridge keys ``exporter`` (also read from ``OTEL_TRACES_EXPORTER``),
``fallback``, ``jsonl_path``, ``capture_dir``, ``otlp_endpoint`` (also read from
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), from
``VERL_OTEL_BRIDGE_*`` or verl's ``otel_bridge`` section. Then:

* RL-Insight selected (``rl_insight`` in verl's ``trainer.logger``, ``VERL_RL_INSIGHT_ENABLE=1``):
  RL-Insight when usable, else the fallback ``jsonl``: to ``jsonl_path`` or ``capture_dir``
  when given, else into :func:`default_dir`'s capture layout (said at INFO: the bridge warns
  that RL-Insight is not usable);
* else an OTLP endpoint makes it ``otlp``;
* ``jsonl_path`` or ``capture_dir`` alone makes it ``jsonl`` (that one file, or run folders in that directory);
* with none of them, ``jsonl`` writes the capture layout into :func:`default_dir`
  (:mod:`verl_otel_bridge._internal.captures`: ``<run>/global_steps=<n>/<host>-<pid>-<k>.jsonl.gz``),
  and each process logs one WARNING naming the run folder and how to choose another destination.

The run folder is made private (:mod:`verl_otel_bridge._internal.private_files`: ``0700``,
owned by the user, not a symbolic link) when the worker starts, never where spans
are made; files are created ``0600`` with ``O_EXCL | O_NOFOLLOW`` as spans arrive. A
folder that cannot be used is logged at WARNING and the spans stay in the bounded
in-memory buffer.

On the driver, :func:`warn_if_spread` says (once) when Ray has several nodes and the
workers write into the node-local default: each node's sessions then stay on that node.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.captures.layout import file_name
from verl_otel_bridge._internal.captures.run import run_folder
from verl_otel_bridge._internal.config import ENV_PREFIX, BridgeConfig, value_sources
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import private_dir
from verl_otel_bridge._internal.verl.config import bridge_config, bridge_section

logger = logging.getLogger(__name__)

#: Bridge keys that, when set anywhere, say where spans go.
DESTINATION_KEYS = ("exporter", "fallback", "jsonl_path", "capture_dir", "otlp_endpoint")

#: The setting that points every process of a run, on every node, at one shared directory.
CAPTURE_DIR_ENV = f"{ENV_PREFIX}CAPTURE_DIR"

_once = OnceLogger(logger)


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/verl_otel_bridge/spans``, by default ``~/.local/state/verl_otel_bridge/spans``.

    The user's state directory (XDG Base Directory): the same place for every
    process of the user on a node, whatever its working directory (Ray workers
    do not run in the driver's), and one directory for all nodes when the home
    directory is shared.
    """
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "verl_otel_bridge" / "spans"


def worker_config(
    verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> BridgeConfig:
    """:func:`~verl_otel_bridge._internal.verl.config.bridge_config` (with keyword ``overrides``), with the plugin's
    default destination when none is configured (see the module docstring): :func:`planned`, and the run
    folder in :func:`default_dir` made when it is the destination or the fallback.

    Raises:
        ValueError: a bad setting (as ``bridge_config``; ``OTEL_TRACES_EXPORTER`` naming no exporter is one).
    """
    env = os.environ if environ is None else environ
    config, in_default_dir = planned(verl_config, environ=env, **overrides)
    if in_default_dir is None:
        return config
    return _in_default_dir(config, env, fallback=in_default_dir == "fallback")


def planned(
    verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> tuple[BridgeConfig, str | None]:
    """What :func:`worker_config` decides, before it makes any folder: the config, and ``"exporter"`` or
    ``"fallback"`` when the capture layout in :func:`default_dir` is then the exporter or RL-Insight's fallback.

    Raises:
        ValueError: as :func:`worker_config`.
    """
    env = os.environ if environ is None else environ
    config = bridge_config(verl_config, environ=env, **overrides)
    if not config.enabled:
        return config, None
    sources = value_sources(bridge_section(verl_config), environ=env, **overrides)
    given = {key for key in DESTINATION_KEYS if sources[key] != "default"}
    if {"exporter", "fallback"} & given:
        return config, None
    local = {"jsonl_path", "capture_dir"} & given
    if config.rl_insight_enable is True:  # RL-Insight when usable; the local destination is its fallback
        return (dataclasses.replace(config, fallback="jsonl"), None) if local else (config, "fallback")
    if "otlp_endpoint" in given:
        return dataclasses.replace(config, exporter="otlp"), None
    if local:
        return dataclasses.replace(config, exporter="jsonl"), None
    return config, "exporter"


def in_default_layout(config: BridgeConfig, env: Mapping[str, str], *, fallback: bool) -> BridgeConfig:
    """``config`` writing (``fallback``: falling back) into the capture layout in :func:`default_dir`; nothing is
    made."""
    capture_dir = str(default_dir(env))
    if fallback:
        return dataclasses.replace(config, fallback="jsonl", capture_dir=capture_dir)
    return dataclasses.replace(config, exporter="jsonl", capture_dir=capture_dir)


def _in_default_dir(config: BridgeConfig, env: Mapping[str, str], *, fallback: bool) -> BridgeConfig:
    """``config`` writing (``fallback``: falling back) into the capture layout in :func:`default_dir`, its run
    folder made private now; said once per run folder: at WARNING, or at INFO for a fallback (the bridge says
    at WARNING when RL-Insight is not usable)."""
    chosen = in_default_layout(config, env, fallback=fallback)
    run = run_folder(chosen)
    try:
        private_dir(private_dir(run.parent) / run.name)  # the default directory is the bridge's: private too
    except OSError as exc:
        logger.warning(
            "verl_otel_bridge: no destination is configured for spans, and the default directory %s cannot be "
            "used (%s); spans stay in this process's bounded memory buffer. Choose a destination: %s",
            run,
            exc,
            _HOW_TO_CHOOSE,
        )
        return config
    _once.log(
        f"default:{run}",
        logging.INFO if fallback else logging.WARNING,
        "verl_otel_bridge: %s, so this process writes them as gzip JSON Lines into the run folder %s (a folder "
        "per step, global_steps=<n>/%s; read them with: verl-otel-bridge report %s). To choose another "
        "destination: %s",
        "while RL-Insight is not usable, spans have no other destination configured"
        if fallback
        else "no destination is configured for spans",
        run,
        file_name(0),
        run,
        _HOW_TO_CHOOSE,
    )
    return chosen


def warn_if_spread(verl_config: Mapping[str, Any], *, environ: Mapping[str, str] | None = None) -> None:
    """On the driver: one WARNING when Ray has more than one node alive and the workers would write into the
    node-local default directory (no destination configured), naming the nodes and :data:`CAPTURE_DIR_ENV`."""
    env = os.environ if environ is None else environ
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:
        if planned(verl_config, environ=env)[1] != "exporter":
            return
        alive = [node for node in ray.nodes() if node.get("Alive")]
        addresses = [f"{node.get('NodeManagerHostname')} ({node.get('NodeManagerAddress')})" for node in alive]
    except Exception as exc:  # noqa: BLE001 - a check only: never in verl's way
        _once.log(
            f"spread:{type(exc).__name__}", logging.DEBUG, "verl_otel_bridge: counting Ray's nodes failed: %r", exc
        )
        return
    if len(addresses) < 2:
        return
    _once.log(
        "spread",
        logging.WARNING,
        "verl_otel_bridge: Ray has %d nodes (%s) and no capture directory is configured, so each node writes its "
        "sessions into its own %s and a report on one node misses the others'. Point every node at one shared "
        "directory: set %s=/shared/path in the job's runtime_env (e.g. "
        "+ray_kwargs.ray_init.runtime_env.env_vars.%s=/shared/path), or choose another destination (docs/verl.md)",
        len(addresses),
        ", ".join(addresses),
        default_dir(env),
        CAPTURE_DIR_ENV,
        CAPTURE_DIR_ENV,
    )


_HOW_TO_CHOOSE = (
    "set VERL_OTEL_BRIDGE_EXPORTER=otlp with OTEL_EXPORTER_OTLP_ENDPOINT, =jsonl with VERL_OTEL_BRIDGE_JSONL_PATH, "
    "or =console, =memory, =none (on Ray through the job's runtime_env; see docs/verl.md)"
)
