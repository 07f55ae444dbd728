"""Where the verl plugin's spans go when nothing says where: a JSON Lines file per process in :func:`default_dir`.

The plugin's workers build their bridge with :func:`worker_config`. It is
:func:`~verl_otel_bridge._internal.verl.config.bridge_config` except when no destination is configured, i.e.
none of these is set: the bridge keys ``exporter``, ``fallback``,
``jsonl_path``, ``otlp_endpoint`` (``VERL_OTEL_BRIDGE_*`` or verl's
``otel_bridge`` section), ``OTEL_TRACES_EXPORTER``, or an OTLP endpoint variable
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). Then:

* RL-Insight selected (``rl_insight`` in verl's ``trainer.logger``, ``VERL_RL_INSIGHT_ENABLE=1``):
  RL-Insight when usable, else the fallback ``jsonl``: to ``jsonl_path`` when given, else to
  this process's file in :func:`default_dir` (said at INFO: the bridge warns that RL-Insight is
  not usable);
* else ``OTEL_TRACES_EXPORTER`` names the exporter (``otlp``, ``console``, ``none``, ``rl_insight``);
* else an OTLP endpoint (variable or ``otlp_endpoint``) makes it ``otlp``;
* ``jsonl_path`` alone makes it ``jsonl`` to that file;
* with none of them, each process appends to its own file in :func:`default_dir`
  (``spans-<host>-<pid>-<start>-<random>.jsonl``), and logs one WARNING naming
  the file and how to choose another destination.

The directory is made private (:mod:`verl_otel_bridge._internal.private_files`: ``0700``,
owned by the user, not a symbolic link) and each file is created ``0600`` with
``O_EXCL | O_NOFOLLOW`` when the worker starts, never where spans are made. A directory that cannot be used is
logged at WARNING and the spans stay in the bounded in-memory buffer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.config import BridgeConfig, value_sources
from verl_otel_bridge._internal.private_files import open_private_new, open_private_read, private_dir
from verl_otel_bridge._internal.verl.config import bridge_config, bridge_section

logger = logging.getLogger(__name__)

#: OpenTelemetry's variable naming the traces exporter.
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
#: OpenTelemetry's OTLP endpoint variables: either one makes ``otlp`` the default.
OTLP_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: ``OTEL_TRACES_EXPORTER`` value -> the bridge's exporter (its ``otlp`` is OTLP/HTTP with protobuf).
TRACES_EXPORTERS = {
    "otlp": "otlp",
    "otlp_proto_http": "otlp",
    "console": "console",
    "none": "none",
    "rl_insight": "rl_insight",
}
#: Bridge keys that, when set anywhere, say where spans go.
DESTINATION_KEYS = ("exporter", "fallback", "jsonl_path", "otlp_endpoint")

# Parts of this process's file name fixed when the plugin first loads: with the
# host and the pid (read at each use, so a forked child gets its own file) they
# differ across workers, nodes and restarts.
_STARTED = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
_RANDOM = secrets.token_hex(4)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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


def process_file_name() -> str:
    """This process's file name in :func:`default_dir`."""
    host = _UNSAFE.sub("_", socket.gethostname()) or "host"
    return f"spans-{host}-{os.getpid()}-{_STARTED}-{_RANDOM}.jsonl"


def worker_config(
    verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> BridgeConfig:
    """:func:`~verl_otel_bridge._internal.verl.config.bridge_config` (with keyword ``overrides``), with the plugin's
    default destination when none is configured (see the module docstring): :func:`planned`, and this
    process's file in :func:`default_dir` made when it is the destination or the fallback.

    Raises:
        ValueError: a bad setting (as ``bridge_config``), or an
            ``OTEL_TRACES_EXPORTER`` the bridge has no exporter for.
    """
    env = os.environ if environ is None else environ
    config, in_default_dir = planned(verl_config, environ=env, **overrides)
    if in_default_dir is None:
        return config
    return _in_default_dir(config, env, fallback=in_default_dir == "fallback")


def planned(
    verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> tuple[BridgeConfig, str | None]:
    """What :func:`worker_config` decides, before it makes any file: the config, and ``"exporter"`` or
    ``"fallback"`` when this process's file in :func:`default_dir` is then the exporter or RL-Insight's fallback.

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
    if config.rl_insight_enable is True:  # RL-Insight when usable; the local destination is its fallback
        if "jsonl_path" in given:
            return dataclasses.replace(config, fallback="jsonl"), None
        return config, "fallback"
    if env.get(TRACES_EXPORTER_ENV, "").strip():
        return dataclasses.replace(config, exporter=_traces_exporter(env[TRACES_EXPORTER_ENV])), None
    if "otlp_endpoint" in given or any(env.get(name, "").strip() for name in OTLP_ENDPOINT_ENVS):
        return dataclasses.replace(config, exporter="otlp"), None
    if "jsonl_path" in given:
        return dataclasses.replace(config, exporter="jsonl"), None
    return config, "exporter"


def _in_default_dir(config: BridgeConfig, env: Mapping[str, str], *, fallback: bool) -> BridgeConfig:
    """``config`` writing (``fallback``: falling back) to this process's file in :func:`default_dir`; said once per
    file: at WARNING, or at INFO for a fallback (the bridge says at WARNING when RL-Insight is not usable)."""
    directory = default_dir(env)
    try:
        path, created = open_process_file(directory)
    except OSError as exc:
        logger.warning(
            "verl_otel_bridge: no destination is configured for spans, and the default directory %s cannot be "
            "used (%s); spans stay in this process's bounded memory buffer. Choose a destination: %s",
            directory,
            exc,
            _HOW_TO_CHOOSE,
        )
        return config
    if created:
        logger.log(
            logging.INFO if fallback else logging.WARNING,
            "verl_otel_bridge: %s, so this process writes them as JSON Lines to %s (one file per process in %s; "
            "read them with: verl-otel-bridge report %s). To choose another destination: %s",
            "while RL-Insight is not usable, spans have no other destination configured"
            if fallback
            else "no destination is configured for spans",
            path,
            directory,
            directory,
            _HOW_TO_CHOOSE,
        )
    if fallback:
        return dataclasses.replace(config, fallback="jsonl", jsonl_path=str(path))
    return dataclasses.replace(config, exporter="jsonl", jsonl_path=str(path))


_HOW_TO_CHOOSE = (
    "set VERL_OTEL_BRIDGE_EXPORTER=otlp with OTEL_EXPORTER_OTLP_ENDPOINT, =jsonl with VERL_OTEL_BRIDGE_JSONL_PATH, "
    "or =console, =memory, =none (on Ray through the job's runtime_env; see docs/verl.md)"
)


def _traces_exporter(value: str) -> str | tuple[str, ...]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACES_EXPORTERS]
    if unknown:
        raise ValueError(
            f"verl_otel_bridge: {TRACES_EXPORTER_ENV}={value!r} names {', '.join(map(repr, unknown))}, which the "
            f"bridge cannot export to (it reads {', '.join(TRACES_EXPORTERS)}); set VERL_OTEL_BRIDGE_EXPORTER, "
            f"which wins over {TRACES_EXPORTER_ENV}, or change {TRACES_EXPORTER_ENV}"
        )
    chosen = tuple(dict.fromkeys(TRACES_EXPORTERS[name] for name in names))
    return chosen[0] if len(chosen) == 1 else chosen


def open_process_file(directory: Path) -> tuple[Path, bool]:
    """Create (``0600``, ``O_EXCL | O_NOFOLLOW``) this process's file in ``directory``, made private first.

    Returns its path and whether it was created now (False: this process made it
    before, e.g. for an earlier bridge, and it is appended to).

    Raises:
        OSError: the directory cannot be made private (:class:`UnsafePathError`), or the
            existing file is not a regular file of this user's alone.
    """
    path = private_dir(directory) / process_file_name()
    try:
        os.close(open_private_new(path))
    except FileExistsError:
        os.close(open_private_read(path))  # checked: a regular file of this user's, 0600, not a link
        return path, False
    return path, True
