"""Is RL-Insight usable, and if not, exactly why.

RL-Insight's three releases differ in ways that matter here (see the docs'
compatibility table): 0.1.0 has no online API, 0.2.0 has no ``__version__`` and
no ``trace_span``, 0.3.0 has both but may report ``"unknown"`` as its version.
And even 0.3.0 silently switches itself off when ``RL_INSIGHT_SERVER_URL`` is
unset or Ray is not initialised. This module checks each of those, in order,
and says which one failed, so the bridge never forwards into a void.

Initialisation goes through :func:`ensure_initialized`, the one entry point
that calls ``rl_insight.init``: once per process, however many threads or
bridges ask at the same time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from packaging.version import InvalidVersion, Version

from verl_otel_bridge._internal.config import RL_INSIGHT_SERVER_URL_ENV, environment_value
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.rl_insight import private
from verl_otel_bridge._version import distribution_version

logger = logging.getLogger(__name__)

MODULE_NAME = "rl_insight"
DISTRIBUTION_NAME = "rl-insight"
SERVER_URL_ENV = RL_INSIGHT_SERVER_URL_ENV


@dataclass(frozen=True)
class Probe:
    """The outcome of checking RL-Insight.

    Attributes:
        usable: spans can be forwarded.
        reason: a stable code: ``ok``, ``not_installed``, ``import_failed``,
            ``no_version``, ``version_unparsable``, ``version_too_old``,
            ``no_trace_span``, ``no_server_url``, ``ray_not_initialized``,
            ``init_failed``; and, found by the exporter after handing RL-Insight a
            batch, ``hub_unavailable`` (its hub actor is gone) and ``hub_no_traces``
            (its hub exports no traces).
        detail: one sentence for humans: what is installed, what is required.
        version: the module's ``__version__`` (None when absent).
        installed: the installed distribution's version from package metadata,
            which also covers releases without ``__version__``.
        module: the imported module, when it imported.
    """

    usable: bool
    reason: str
    detail: str
    version: str | None = None
    installed: str | None = None
    module: ModuleType | None = None

    @property
    def static(self) -> bool:
        """True when the reason cannot change while the process runs (what is installed)."""
        return self.reason in STATIC_REASONS


#: Reasons fixed by what is installed; the others (server URL, Ray, init, the hub) can change at runtime.
STATIC_REASONS = frozenset(
    {"not_installed", "import_failed", "no_version", "version_unparsable", "version_too_old", "no_trace_span"}
)


def probe_module(minimum_version: str) -> Probe:
    """Check what cannot change at runtime: import, version, ``trace_span``."""
    installed = installed_version()
    try:
        module = importlib.import_module(MODULE_NAME)
    except ModuleNotFoundError as exc:
        if exc.name == MODULE_NAME:
            return Probe(False, "not_installed", f"rl-insight is not installed (requires >= {minimum_version})")
        return _import_failed(exc, installed, minimum_version)
    except Exception as exc:  # noqa: BLE001 - a broken install must not break the caller
        return _import_failed(exc, installed, minimum_version)

    raw = getattr(module, "__version__", None)
    shown = f"rl-insight {installed or '(version unknown)'}"
    if raw is None:
        return Probe(
            False,
            "no_version",
            f"{shown} is installed but its module has no __version__ (releases before 0.3.0); "
            f"requires >= {minimum_version}",
            installed=installed,
            module=module,
        )

    def found(usable: bool, reason: str, detail: str) -> Probe:
        """A probe of this import, of version ``raw``."""
        return Probe(usable, reason, detail, version=str(raw), installed=installed, module=module)

    try:
        version = Version(str(raw))
    except InvalidVersion:
        return found(
            False,
            "version_unparsable",
            f"rl_insight.__version__ is {raw!r}, not a version (installed: {installed}); requires >= {minimum_version}",
        )
    if version < Version(minimum_version):
        return found(False, "version_too_old", f"rl-insight {raw} is installed; requires >= {minimum_version}")
    try:
        trace_span = getattr(module, "trace_span", None)
    except Exception as exc:  # noqa: BLE001 - lazy attribute loaders can raise anything
        # 0.3.0 loads its API lazily: a broken dependency (e.g. omegaconf) surfaces here.
        return Probe(
            False,
            "import_failed",
            f"rl-insight {raw} is installed but loading rl_insight.trace_span raised {type(exc).__name__}: {exc}; "
            f"requires >= {minimum_version}",
            version=str(raw),
            installed=installed,
        )
    if not callable(trace_span):
        return found(False, "no_trace_span", f"rl-insight {raw} is installed but has no callable rl_insight.trace_span")
    return found(True, "ok", f"rl-insight {raw}")


def _import_failed(exc: BaseException, installed: str | None, minimum_version: str) -> Probe:
    # rl-insight 0.1.0's wheel cannot be imported at all (it lacks rl_insight.parser),
    # so its package metadata is the only place its version can be read.
    detail = (
        f"rl-insight {installed or '(version unknown)'} is installed but import rl_insight raised "
        f"{type(exc).__name__}: {exc}; requires >= {minimum_version}"
    )
    return Probe(False, "import_failed", detail, installed=installed)


def server_url(url: str | None, init_config: Mapping[str, Any] | None) -> str | None:
    """The RL-Insight server URL: ``url`` (the bridge's ``rl_insight_server_url``), else
    ``init_config["server"]["url"]``, else ``RL_INSIGHT_SERVER_URL`` as it is now."""
    return url or config_server_url(init_config) or environment_value(SERVER_URL_ENV) or None


def check_runtime(probe: Probe, url: str | None) -> Probe:
    """Check the preconditions RL-Insight needs but does not report: server URL (from :func:`server_url`) and Ray."""
    if not probe.usable:
        return probe
    if not url:
        return with_reason(probe, "no_server_url", f"{SERVER_URL_ENV} is not set, so RL-Insight would disable itself")
    ray = sys.modules.get("ray")
    try:
        if ray is None:
            ray = importlib.import_module("ray")
        ray_ready = bool(ray.is_initialized())
    except Exception:  # noqa: BLE001
        ray_ready = False
    if not ray_ready:
        return with_reason(probe, "ray_not_initialized", "Ray is not initialized, so RL-Insight would disable itself")
    return probe


def with_reason(probe: Probe, reason: str, detail: str) -> Probe:
    """``probe`` made unusable for ``reason``, its ``detail`` extended with ``detail``."""
    return Probe(False, reason, f"{probe.detail}: {detail}", probe.version, probe.installed, probe.module)


class _InitOnce:
    """RL-Insight's ``init`` is once per process, so this record is too."""

    def __init__(self) -> None:
        self.calls = 0
        #: Why the one ``init`` call failed, kept so later checks still say it.
        self.error: str | None = None
        #: Unusable-reasons already logged in this process (see :func:`claim_reason`).
        self.said: set[tuple[object, ...]] = set()
        self._new_locks()
        reinit_after_fork(self._new_locks)

    def _new_locks(self) -> None:
        # Also after a fork: a thread of the parent may have held the lock during rl_insight.init.
        self.lock = threading.Lock()
        self.said_lock = threading.Lock()


def claim_reason(noted: set[str], reason: str, key: tuple[object, ...]) -> bool | None:
    """Atomically: None if ``noted`` (one exporter's) has ``reason`` already; else record it there
    and return whether ``key`` is new in this process.

    A reason that cannot change while the process runs (``Probe.static``) is
    logged once per process, not once per bridge: a process that replaces its
    bridge (spans before ``RLInsightLogger.init``, a second run) says it once.
    """
    with _INIT.said_lock:
        if reason in noted:
            return None
        noted.add(reason)
        if key in _INIT.said:
            return False
        _INIT.said.add(key)
        return True


_INIT = _InitOnce()


def ensure_initialized(
    probe: Probe,
    *,
    project: str | None,
    experiment_name: str | None,
    config: Mapping[str, Any] | None,
) -> Probe:
    """Call ``rl_insight.init`` unless it already ran in this process.

    Returns ``probe`` when RL-Insight is on afterwards, else a probe with reason
    ``init_failed`` (RL-Insight logs its own reason and returns None, so this
    reads its state back to tell).
    """
    module = probe.module
    if not probe.usable or module is None:
        return probe
    with _INIT.lock:
        if private.monitoring_enabled(module) is True:
            return probe
        if _INIT.calls == 0:
            _INIT.calls += 1
            try:
                module.init(project=project, experiment_name=experiment_name, config=dict(config or {}))
            except Exception as exc:  # noqa: BLE001
                _INIT.error = f"rl_insight.init raised {type(exc).__name__}: {exc}"
                return with_reason(probe, "init_failed", _INIT.error)
        state = private.monitoring_enabled(module)
        error = _INIT.error
    if state is False:
        return with_reason(
            probe,
            "init_failed",
            error or "RL-Insight monitoring is off after init (init failed, see its log, or rl_insight.finish() ran)",
        )
    return probe


def finish(module: ModuleType) -> None:
    """Call ``rl_insight.finish()`` and forget the init, so a later run in this process can init again."""
    with _INIT.lock:
        try:
            module.finish()
        finally:
            _INIT.calls = 0
            _INIT.error = None


def config_server_url(config: Mapping[str, Any] | None) -> str | None:
    """``config["server"]["url"]``, which ``rl_insight.init`` also accepts, if set."""
    server = (config or {}).get("server")
    url = server.get("url") if isinstance(server, Mapping) else None
    return str(url).strip() or None if url else None


def with_server_url(config: Mapping[str, Any] | None, server_url: str | None) -> dict[str, Any]:
    """``config`` for ``rl_insight.init`` with ``server.url`` set to ``server_url`` (when given).

    ``rl_insight.init`` reads the URL only from ``RL_INSIGHT_SERVER_URL`` or
    ``config["server"]["url"]``, so a URL given to the bridge must travel there.
    """
    merged = dict(config or {})
    if server_url:
        server = merged.get("server")
        merged["server"] = {**(dict(server) if isinstance(server, Mapping) else {}), "url": server_url}
    return merged


def init_calls() -> int:
    """How many times this process called ``rl_insight.init`` (0 or 1)."""
    return _INIT.calls


def installed_version() -> str | None:
    """The installed rl-insight distribution's version, from its metadata (nothing is imported)."""
    return distribution_version(DISTRIBUTION_NAME)
