"""What the verl plugin will do in this environment, found without importing verl (``doctor``'s verl part).

The installed verl's version and source (checked against the target table), whether its
``import verl`` loads the plugin (the ``verl.plugins`` entry point from verl 0.9.0 on, else
``VERL_USE_EXTERNAL_MODULES``), whether the plugin imports and registers its hooks, where its
spans go with this environment, and which ``RLInsightLogger`` verl would build.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.config import BridgeConfig, parse_bool
from verl_otel_bridge._internal.pipeline.route import Route
from verl_otel_bridge._internal.verl import destination, source
from verl_otel_bridge._internal.verl.logger import logger_choice
from verl_otel_bridge._internal.verl.switch import BACKEND, SWITCH_ENV
from verl_otel_bridge._internal.verl.targets import (
    ENTRY_POINT_GROUP,
    EXTERNAL_MODULES_ENV,
    EXTERNAL_PLUGINS_ENV,
    FIRST_VERL_LOADING_PLUGINS,
    PLUGIN_MODULE,
    RL_INSIGHT_LOGGER,
    TARGETS,
    TRACKING,
)
from verl_otel_bridge._version import install_command

#: What to set on a verl that loads no ``verl.plugins`` entry point (verl 0.8.0).
EXTERNAL_MODULES_ROUTE = f"{EXTERNAL_MODULES_ENV}={PLUGIN_MODULE}"


def checkup(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The verl plugin's state in this environment, JSON-ready; None when verl is not installed.

    Keys: ``version``, ``location``, ``loads_plugins`` (its ``import verl`` loads ``verl.plugins`` entry
    points), ``plugin`` (``entry_point``, ``loaded_by``, ``error``), ``targets`` (``checked``,
    ``not_as_expected``), ``tracing``, ``destination``, ``rl_insight_logger``, ``problems``, ``hints``.
    """
    env = os.environ if environ is None else environ
    spec = importlib.util.find_spec("verl")  # finds the package without importing it (4-7 s, and torch)
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    tree = source.SourceTree(package.parent)
    problems: list[str] = []
    hints: list[str] = []
    init = (package / "__init__.py").read_text(errors="replace")
    version = tree.version or "unknown"
    report: dict[str, Any] = {
        "version": version,
        "location": str(package),
        "loads_plugins": ENTRY_POINT_GROUP in init,
        "plugin": _plugin(env, init, version, problems, hints),
        "targets": _targets(tree, version, problems),
        "tracing": _tracing(env),
        "destination": _destination(env, problems),
        "rl_insight_logger": _rl_insight_logger(env, tree, version),
        "problems": problems,
        "hints": hints,
    }
    return report


def plugin_config(environ: Mapping[str, str] | None = None) -> BridgeConfig:
    """The configuration a verl worker's bridge gets from this environment (:func:`destination.planned`), writing
    into the capture layout in the default directory when that is where its spans go (no folder is made).

    Raises:
        ValueError: a bad setting.
    """
    env = os.environ if environ is None else environ
    config, in_default_dir = destination.planned({}, environ=env)
    if in_default_dir is None:
        return config
    return destination.in_default_layout(config, env, fallback=in_default_dir == "fallback")


def _plugin(env: Mapping[str, str], init: str, version: str, problems: list[str], hints: list[str]) -> dict[str, Any]:
    found = [e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.value == PLUGIN_MODULE]
    entry = found[0] if found else None
    policy = env.get(EXTERNAL_PLUGINS_ENV, "auto").strip().lower()
    allowed = policy == "auto" or (entry is not None and entry.name in {p.strip() for p in policy.split(",")})
    named = PLUGIN_MODULE in [m.strip() for m in env.get(EXTERNAL_MODULES_ENV, "").split(",")]
    loaded_by = None
    if ENTRY_POINT_GROUP in init and entry is not None and policy != "none" and allowed:
        loaded_by = f"the {ENTRY_POINT_GROUP} entry point {entry.name!r}"
    elif EXTERNAL_MODULES_ENV in init and named:
        loaded_by = EXTERNAL_MODULES_ENV
    error = _loads(problems, hints)
    if loaded_by is None:
        if ENTRY_POINT_GROUP not in init:
            problems.append(
                f"verl {version} loads no {ENTRY_POINT_GROUP} entry point (from {FIRST_VERL_LOADING_PLUGINS} on it "
                f"does), and {EXTERNAL_MODULES_ENV} does not name the plugin: verl is not traced"
            )
            hints.append(f"export {EXTERNAL_MODULES_ROUTE} (on Ray, in the job's runtime_env too; docs/verl.md)")
        elif entry is None:
            problems.append(f"this package's {ENTRY_POINT_GROUP} entry point is not installed: verl is not traced")
            hints.append(f"reinstall the package: {install_command('verl')}")
        else:
            problems.append(f"{EXTERNAL_PLUGINS_ENV}={policy!r} keeps verl from loading the plugin {entry.name!r}")
            hints.append(f"unset {EXTERNAL_PLUGINS_ENV}, or add {entry.name} to it")
    return {"entry_point": f"{entry.name} = {entry.value}" if entry else None, "loaded_by": loaded_by, "error": error}


def _loads(problems: list[str], hints: list[str]) -> str | None:
    """Import the plugin and register its hooks as ``import verl`` does (verl itself says a failure at DEBUG
    only); the reason it cannot, or None."""
    try:
        plugin = importlib.import_module(PLUGIN_MODULE)
        registered = plugin.register()
    except Exception as exc:  # noqa: BLE001 - what a broken install raises is the answer
        error = f"{type(exc).__name__}: {exc}"
        problems.append(f"the verl plugin ({PLUGIN_MODULE}) does not load: {error}")
        hints.append(f"reinstall the package: {install_command('verl')}")
        return error
    if not registered:
        problems.append("the verl plugin needs wrapt, which is not installed: verl is not traced")
        hints.append(f"install it: {install_command('verl')}")
        return "wrapt is not installed"
    return None


def _targets(tree: source.SourceTree, version: str, problems: list[str]) -> dict[str, Any]:
    findings = [str(finding) for finding in source.check(tree)]
    if findings:
        problems.append(
            f"verl {version}: {len(findings)} of what the plugin wraps or reads is not as it knows it (that part is "
            f"not traced): {'; '.join(findings)}"
        )
    return {"checked": len(TARGETS), "not_as_expected": findings}


def _tracing(env: Mapping[str, str]) -> str:
    switch = env.get(SWITCH_ENV, "").strip()
    if switch:
        try:
            return f"{'on' if parse_bool(switch) else 'off'} ({SWITCH_ENV}={switch})"
        except ValueError:
            return f"{SWITCH_ENV}={switch!r} is not on or off, so it is ignored"
    return f"per run: on when verl's actor_rollout_ref.rollout.trace.backend={BACKEND} (or {SWITCH_ENV}=1)"


def _destination(env: Mapping[str, str], problems: list[str]) -> str:
    """Where a worker's spans go with this environment (verl's config may add ``otel_bridge`` settings)."""
    try:
        config, in_default_dir = destination.planned({}, environ=env)
    except ValueError as exc:
        problems.append(f"the plugin's workers would not start: {exc}")
        return f"none: {exc}"
    files = f"the default directory {destination.default_dir(env)} (gzip JSON Lines, a folder per run and step)"
    if in_default_dir == "exporter":
        return f"{files}: no destination is configured"
    if in_default_dir == "fallback":
        return f"RL-Insight when usable (it is selected), else {files}"
    return Route.of(config).why


def _rl_insight_logger(env: Mapping[str, str], tree: source.SourceTree, version: str) -> str:
    if not tree.scopes(TRACKING, RL_INSIGHT_LOGGER):
        return f"none: verl {version} has no {RL_INSIGHT_LOGGER}"
    choice = logger_choice(env)
    return f"{'the bridge' if choice.plugin else 'verl'}'s: {choice.reason}"
