"""Fake ``rl_insight`` and ``ray`` modules, shaped like each real RL-Insight release.

FOR UNIT TESTS OF EDGE CASES ONLY: the real releases are exercised by
``tests/integration``. Everything here is installed through pytest's
``monkeypatch`` (``sys.modules``, ``sys.meta_path`` and
``rl_insight_compat.installed_version``), so it is undone after each test.

What each fake has, mirroring the released wheels:

========  =============  ==========================================================
release   ``__version__``  public API
========  =============  ==========================================================
0.1.0     absent         offline parsers only (``MstxClusterParser``, ``main``)
0.2.0     absent         ``init finish metric_* trace_op trace_state update_prometheus_config``
0.3.0     ``"0.3.0"``    0.2.0's API + ``trace_span``, ``agent_loop_session``
========  =============  ==========================================================

0.2.0 and 0.3.0 also get a submodule ``rl_insight.api`` whose ``_STATE.enabled``
``init`` sets to True only when a server URL is known (``RL_INSIGHT_SERVER_URL``
or ``config["server"]["url"]``) *and* ``ray.is_initialized()``; otherwise it
stays False and ``trace_span`` is a silent no-op, as in the real 0.3.0.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat

_RELEASE = object()  # "use what the release has"
RELEASES = ("0.1.0", "0.2.0", "0.3.0")


# -- ray -----------------------------------------------------------------------


class FakeRay(types.ModuleType):
    """A ``ray`` module with only ``is_initialized()``; flip ``initialized`` at will."""

    def __init__(self, initialized: bool) -> None:
        super().__init__("ray")
        self.initialized = initialized

    def is_initialized(self) -> bool:
        return self.initialized


def install_ray(monkeypatch: pytest.MonkeyPatch, *, initialized: bool = True) -> FakeRay:
    ray = FakeRay(initialized)
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


# -- rl_insight ----------------------------------------------------------------


@dataclass
class _State:
    """Stands in for ``rl_insight.api._MonitorState``."""

    enabled: bool = False
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceSpanCall:
    """One delivered ``rl_insight.trace_span`` call."""

    name: str
    start_time_ns: int
    end_time_ns: int
    attributes: dict[str, Any]


class FakeRLInsight:
    """The installed fake plus what it saw.

    Attributes:
        module: the ``rl_insight`` module in ``sys.modules``.
        api: the ``rl_insight.api`` submodule (None for 0.1.0).
        init_calls: keyword arguments of every ``init`` call.
        hook: called with each ``trace_span`` call's keyword arguments before it
            is delivered; may raise or block (failure injection).
        init_delay_s: how long ``init`` takes (widens races in concurrency tests).
    """

    def __init__(self, release: str) -> None:
        self.release = release
        self.module = types.ModuleType("rl_insight")
        self.api: types.ModuleType | None = None
        self.init_calls: list[dict[str, Any]] = []
        self.hook: Callable[[dict[str, Any]], None] | None = None
        self.init_delay_s = 0.0
        self._lock = threading.Lock()
        self._calls: list[TraceSpanCall] = []
        self._ignored = 0

    # what the fake recorded --------------------------------------------------

    @property
    def calls(self) -> list[TraceSpanCall]:
        """``trace_span`` calls delivered while monitoring was enabled."""
        with self._lock:
            return list(self._calls)

    @property
    def ignored(self) -> int:
        """``trace_span`` calls made while monitoring was disabled (lost, like the real one)."""
        with self._lock:
            return self._ignored

    def by_name(self, name: str) -> list[TraceSpanCall]:
        return [call for call in self.calls if call.name == name]

    @property
    def enabled(self) -> bool:
        return bool(self.api is not None and self.api._STATE.enabled)

    def enable(self) -> None:
        """Act as if someone else already ran ``rl_insight.init`` successfully."""
        assert self.api is not None
        self.api._STATE = _State(enabled=True)

    # the fake API ------------------------------------------------------------

    def _init(self, project: Any = None, experiment_name: Any = None, config: Mapping[str, Any] | None = None) -> None:
        assert self.api is not None
        self.init_calls.append({"project": project, "experiment_name": experiment_name, "config": config})
        if self.init_delay_s:
            time.sleep(self.init_delay_s)  # the real init is slow (it creates a Ray actor)
        if self.api._STATE.enabled:
            warnings.warn("[rl-insight] monitor.init() called more than once", RuntimeWarning, stacklevel=2)
            return
        server = dict((config or {}).get("server") or {})
        url = os.environ.get("RL_INSIGHT_SERVER_URL") or str(server.get("url") or "")
        if not url.strip():
            return  # the real one logs an error and stays disabled
        ray = sys.modules.get("ray")
        client = object() if ray is not None and ray.is_initialized() else None
        labels = {k: v for k, v in {"project": project, "experiment_name": experiment_name}.items() if v is not None}
        self.api._STATE = _State(enabled=client is not None, labels=labels)

    def _finish(self) -> None:
        assert self.api is not None
        self.api._STATE = _State()

    def _trace_span(self, *, name: str, start_time_ns: int, end_time_ns: int, attributes: Mapping[str, Any]) -> None:
        call = {"name": name, "start_time_ns": start_time_ns, "end_time_ns": end_time_ns, "attributes": attributes}
        if self.hook is not None:
            self.hook(call)
        with self._lock:
            if not self.enabled:
                self._ignored += 1
                return
            self._calls.append(TraceSpanCall(name, start_time_ns, end_time_ns, dict(attributes)))

    def _agent_loop_session(self, **kwargs: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(identity=dict(kwargs), start_ns=time.time_ns())


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _noop_cm(*args: Any, **kwargs: Any) -> Any:
    yield


def _lazy_getattr(module_name: str) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:  # like the real releases' lazy export loader
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__


def install_rl_insight(
    monkeypatch: pytest.MonkeyPatch,
    release: str = "0.3.0",
    *,
    version: Any = _RELEASE,
    installed: Any = _RELEASE,
    trace_span: Any = _RELEASE,
) -> FakeRLInsight:
    """Install a fake ``rl_insight`` shaped like ``release``.

    Args:
        release: which real release's surface to copy (``0.1.0``/``0.2.0``/``0.3.0``).
        version: ``__version__`` to expose instead of the release's (None: absent),
            e.g. ``"0.3.0rc1"``, ``"unknown"``, ``"1.0"``.
        installed: what package metadata reports as the installed distribution
            version (None: no metadata); defaults to ``release``.
        trace_span: replaces ``trace_span`` (e.g. a non-callable); 0.3.0 only.
    """
    assert release in RELEASES, release
    fake = FakeRLInsight(release)
    module = fake.module
    module.__getattr__ = _lazy_getattr("rl_insight")  # type: ignore[attr-defined]
    if release == "0.1.0":
        module.MstxClusterParser = type("MstxClusterParser", (), {})  # type: ignore[attr-defined]
        module.TorchClusterParser = type("TorchClusterParser", (), {})  # type: ignore[attr-defined]
        module.main = _noop  # type: ignore[attr-defined]
        del module.__getattr__  # 0.1.0 has no lazy loader
    else:
        api = types.ModuleType("rl_insight.api")
        api._STATE = _State()  # type: ignore[attr-defined]
        fake.api = api
        public = {
            "init": fake._init,
            "finish": fake._finish,
            "metric_count": _noop,
            "metric_gauge": _noop,
            "metric_histogram": _noop,
            "trace_op": lambda *a, **k: lambda func: func,
            "trace_state": _noop_cm,
            "update_prometheus_config": _noop,
        }
        if release == "0.3.0":
            public["trace_span"] = fake._trace_span
            public["agent_loop_session"] = fake._agent_loop_session
            module.__version__ = "0.3.0"  # type: ignore[attr-defined]
        for name, value in public.items():
            setattr(api, name, value)
            setattr(module, name, value)
        module.api = api  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "rl_insight.api", api)
    if version is not _RELEASE:
        if version is None:
            module.__dict__.pop("__version__", None)
        else:
            module.__version__ = version  # type: ignore[attr-defined]
    if trace_span is not _RELEASE:
        module.trace_span = trace_span  # type: ignore[attr-defined]
    setinstalled_version(monkeypatch, release if installed is _RELEASE else installed)
    monkeypatch.setitem(sys.modules, "rl_insight", module)
    return fake


def setinstalled_version(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """Control what ``importlib.metadata`` would say is installed."""
    monkeypatch.setattr(rl_insight_compat, "installed_version", lambda: version)


def hide_rl_insight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``rl_insight`` and ``ray`` unimportable, whatever the environment has installed."""
    for name in [n for n in sys.modules if n == "rl_insight" or n.startswith("rl_insight.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rl_insight", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    setinstalled_version(monkeypatch, None)


class _RaisingImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "rl_insight" else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        raise self.exc


def install_broken_rl_insight(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException, *, installed: str | None = "0.3.0"
) -> None:
    """Make ``import rl_insight`` raise ``exc`` (a broken install: missing dependency, bad binary...)."""
    monkeypatch.delitem(sys.modules, "rl_insight", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_RaisingImport(exc), *sys.meta_path])
    setinstalled_version(monkeypatch, installed)


def usable_rl_insight(monkeypatch: pytest.MonkeyPatch, release_version: str = "0.3.0") -> FakeRLInsight:
    """A 0.3.0-shaped fake with everything RL-Insight needs: server URL set, Ray initialized."""
    fake = install_rl_insight(monkeypatch, "0.3.0", version=release_version, installed=release_version)
    install_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")
    return fake
