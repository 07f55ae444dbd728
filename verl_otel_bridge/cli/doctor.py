"""``verl-otel-bridge doctor``: what is installed, how the bridge is configured, and where spans would go.

:func:`diagnose` returns the report as a dict (the command renders it, or prints it
as JSON with ``--json``). Secrets never appear in it: URL user info and the values
of keys that look like credentials are masked, and any such value found in the
environment is scrubbed from every other line.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.captures.doctor import describe_runs
from verl_otel_bridge._internal.config import ENV_PREFIX, BridgeConfig, value_sources
from verl_otel_bridge._internal.exporter_names import destination_module
from verl_otel_bridge._internal.pipeline.route import Route
from verl_otel_bridge._internal.pipeline.spill import SpillSettings
from verl_otel_bridge._internal.records import parse_json
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge._internal.rl_insight.otlp import fetch_services, trace_endpoint
from verl_otel_bridge._internal.secrets import Scrubber, mask_url, masked, secrets_in
from verl_otel_bridge._internal.verl.checkup import checkup, plugin_config
from verl_otel_bridge._internal.verl.destination import default_dir
from verl_otel_bridge._version import __version__, distribution_version, install_command

#: How long ``doctor`` waits for the RL-Insight server.
SERVER_TIMEOUT_S = 2.0


def _environment_secrets(environ: Mapping[str, str]) -> set[str]:
    """Secrets in the variables the bridge reads, for when the configuration does not even resolve."""
    found: set[str] = set()
    for name, raw in environ.items():
        if not (name.startswith((ENV_PREFIX, "OTEL_")) or name == rl_insight_compat.SERVER_URL_ENV):
            continue
        found |= secrets_in(raw, name)
        if name.endswith("RL_INSIGHT_CONFIG"):
            try:
                found |= secrets_in(parse_json(raw))
            except ValueError:
                found.add(raw)  # unreadable JSON may hold anything: never echo it
    return found


# -- doctor ----------------------------------------------------------------------


def check_server(server_url: str, timeout_s: float = SERVER_TIMEOUT_S) -> dict[str, Any]:
    """``GET {server_url}/api/v1/services``: whether RL-Insight's server answers, and the ports it advertises."""
    result: dict[str, Any] = {
        "url": mask_url(server_url),
        "reachable": False,
        "status": None,
        "otlp_port": None,
        "ports": {},
        "trace_endpoint": None,
        "error": None,
    }
    try:
        data = fetch_services(server_url, timeout_s)
    except (OSError, ValueError) as exc:
        result["error"] = mask_url(f"{type(exc).__name__}: {exc}")
        return result
    result["reachable"] = True
    result["status"] = data.get("status")
    result["ports"] = {k: v for k, v in data.items() if k.endswith("_port")}
    port = data.get("otlp_port")
    result["otlp_port"] = port
    if port:
        try:
            result["trace_endpoint"] = trace_endpoint(server_url, port)
        except ValueError as exc:
            result["error"] = str(exc)
    return result


_HINTS = {
    "not_installed": f"install RL-Insight: {install_command('rl-insight')}",
    "import_failed": "repair the rl-insight installation (importing it fails; see the detail)",
    "no_version": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "version_unparsable": "reinstall RL-Insight so its package metadata is present: "
    "pip install --force-reinstall 'rl-insight>=0.3.0'",
    "version_too_old": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "no_trace_span": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "no_server_url": "set RL_INSIGHT_SERVER_URL (or VERL_OTEL_BRIDGE_RL_INSIGHT_SERVER_URL) to the RL-Insight server, "
    "e.g. http://<host>:<port>",
    "ray_not_initialized": "install Ray (pip install ray); RL-Insight exports only from processes where ray.init() ran",
}


def diagnose(environ: Mapping[str, str] | None = None, *, timeout_s: float = SERVER_TIMEOUT_S) -> dict[str, Any]:
    """Everything ``doctor`` reports, as a JSON-ready dict; ``ok`` says whether spans reach what the config asks for.

    Under plain ``exporter: auto`` (RL-Insight not asked for by name or by
    ``rl_insight_enable=true``) the local fallback is what was asked for when RL-Insight is
    unusable: ``ok``, with a note on how to reach RL-Insight.

    Uses the same checks as the RL-Insight exporter
    (:func:`rl_insight_compat.probe_module` and :func:`rl_insight_compat.check_runtime`)
    without calling ``rl_insight.init``. Ray counts as initialized when it is
    installed (the training process runs ``ray.init()``, this one does not).
    Secrets never appear in the result.

    Keys: ``ok``, ``versions``, ``config`` (``error``, ``values``: key ->
    ``{value, source}``), ``route`` (where spans go and why; None when the
    configuration does not resolve), ``server`` (the RL-Insight server check;
    None without a server URL), ``verl`` (the installed verl and what the verl
    plugin does there: :func:`~verl_otel_bridge._internal.verl.checkup.checkup`; None
    without verl), ``problems`` (each makes ``ok`` false), ``hints``
    (their fixes), ``notes`` (expected states worth knowing, e.g. how to reach RL-Insight).

    Raises:
        ValueError: ``timeout_s`` is not a positive, finite number of seconds.
    """
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r}: must be a positive, finite number of seconds")
    env = os.environ if environ is None else environ
    problems: list[str] = []
    hints: list[str] = []
    notes: list[str] = []
    report: dict[str, Any] = {
        "ok": False,
        "versions": {},
        "config": None,
        "route": None,
        "server": None,
        "verl": None,
        "captures": None,
        "problems": problems,
        "hints": hints,
        "notes": notes,
    }
    sources = value_sources(environ=env)
    try:
        config: BridgeConfig | None = BridgeConfig.resolve(environ=env)
    except ValueError as exc:
        config = None
        report["config"] = {
            "error": str(exc),
            "values": {key: {"value": None, "source": source} for key, source in sources.items()},
        }
        problems.append(f"the configuration does not resolve: {exc}")
    minimum = (config or BridgeConfig()).rl_insight_min_version
    static = rl_insight_compat.probe_module(minimum)
    ray_version = distribution_version("ray")
    report["versions"] = {
        "python": platform.python_version(),
        "verl-otel-bridge": __version__,
        "opentelemetry-api": distribution_version("opentelemetry-api"),
        "opentelemetry-sdk": distribution_version("opentelemetry-sdk"),
        "urllib3": distribution_version("urllib3"),
        "rl-insight": static.installed or rl_insight_compat.installed_version(),  # the probe's metadata lookup
        "rl_insight.__version__": static.version,
        "ray": ray_version,
    }
    verl = checkup(env)  # the verl plugin: None without verl
    if verl is not None:
        report["verl"] = {key: value for key, value in verl.items() if key not in ("problems", "hints")}
        problems.extend(verl["problems"])
        hints.extend(verl["hints"])
    if config is None:
        return Scrubber(_environment_secrets(env))(report)  # type: ignore[no-any-return]

    values = config.to_dict()
    scrub = Scrubber.of(values)
    report["config"] = {
        "error": None,
        "values": {key: {"value": masked(key, value), "source": sources[key]} for key, value in values.items()},
    }
    if verl is not None and verl["plugin"]["loaded_by"] and not verl["plugin"]["error"]:
        try:  # verl's processes trace with the plugin's configuration: where spans go is where it sends them
            config = plugin_config(env)
            notes.append("verl loads the verl plugin: 'Where spans go' is where its processes send them")
        except ValueError:
            pass  # said in the verl problems; the environment's own configuration below
    spill = SpillSettings.of(config)
    if spill is not None:  # the directory status() reports, also when the default chooses it
        report["config"]["values"]["spill_dir"]["value"] = spill.spill_dir
    server_url = rl_insight_compat.server_url(config.rl_insight_server_url, config.rl_insight_config)
    if server_url:
        report["server"] = check_server(server_url, timeout_s)
    server = report["server"]

    planned = Route.of(config)
    route: dict[str, Any] = {
        "exporter": list(config.exporters) if planned.copies else planned.primary,
        "rl_insight_wanted": ("explicitly" if planned.explicit else "if usable") if planned.wants_rl_insight else "no",
        "preferred": None,
        "destination": None,
        "reason": None,
        "detail": None,
        "transport": None,
        "ray": None,
        "local": None,
        "copies": [],
    }
    report["route"] = route

    if not config.enabled:
        route.update(
            preferred="none",
            destination="none",
            reason="disabled",
            detail=planned.why,
        )
        report["ok"] = True
        return scrub(report)  # type: ignore[no-any-return]

    if planned.wants_rl_insight:
        probe = rl_insight_compat.check_runtime(static, server_url)
        # This process never ran ray.init(); the training job does (verl's trainer and
        # workers). Ray being installed is what can be checked from here. The Ray check
        # is check_runtime's last, so everything before it passed.
        assumed = probe.reason == "ray_not_initialized" and ray_version is not None
        if assumed:
            probe = static
        if static.usable and server_url:
            route["ray"] = (
                f"ray {ray_version} is installed; RL-Insight also needs ray.init() in the process that exports "
                "(verl's trainer and workers run it), which is assumed here"
                if assumed
                else "initialized in this process"
                if probe.usable
                else "not installed"
            )
        why = planned.why
        route.update(preferred="rl_insight", reason=probe.reason)
        if probe.usable:
            route["destination"] = "rl_insight"
            route["detail"] = f"{why}; {probe.detail} is usable"
            route["transport"] = _transport(config, server)
            if server is not None and not server["reachable"]:
                problems.append(f"the RL-Insight server at {server['url']} does not answer ({server['error']})")
                hints.append("start the RL-Insight server (rl-insight server start) or fix the server URL")
        else:
            route["destination"] = f"{config.fallback} (fallback)"
            route["detail"] = f"{why}; RL-Insight is not usable: {probe.detail}"
            unusable = f"RL-Insight is not usable ({probe.reason}): {probe.detail}"
            if planned.explicit:
                problems.append(unusable)
                if probe.reason in _HINTS:
                    hints.append(_HINTS[probe.reason])
            else:  # plain auto: the fallback is what was asked for while RL-Insight is unusable
                notes.append(f"{unusable}; spans go to the {config.fallback} fallback, as exporter=auto intends")
                if probe.reason in _HINTS:
                    notes.append(f"to send them to RL-Insight: {_HINTS[probe.reason]}")
    else:
        route.update(preferred=planned.local, destination=planned.local, reason="configured", detail=planned.why)
    for index, name in enumerate(planned.names):
        check = {"exporter": name, **destination_module(name).check(config, env, timeout_s)}
        if check.get("fix"):
            hints.append(check["fix"])
        if index == 0:
            route["local"] = check  # the fallback when RL-Insight is wanted, else the exporter itself
        else:
            route["copies"].append(check)
        if not check["ok"]:
            role = "copy" if index else ("fallback" if planned.wants_rl_insight else "exporter")
            problems.append(f"{role} {name!r} cannot be used: {check['detail']}")
    report["captures"] = captures(config, env)
    reached = route["destination"] == route["preferred"] or not planned.explicit
    report["ok"] = reached and not problems
    return scrub(report)  # type: ignore[no-any-return]


def captures(config: BridgeConfig, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The capture directory spans go to (``capture_dir``, else the verl plugin's default when it exists) and
    the runs in it, newest first (names and sizes only; docs/protocol.md#capture-directories); None without one."""
    directory = Path(config.capture_dir).expanduser() if config.capture_dir else default_dir(environ)
    if not config.capture_dir and not directory.is_dir():
        return None
    return {"dir": str(directory), "runs": describe_runs(directory)}


def _transport(config: BridgeConfig, server: dict[str, Any] | None) -> str:
    if config.rl_insight_transport == "hub":
        return "hub: rl_insight.trace_span per span (rl_insight_transport=hub)"
    endpoint = server.get("trace_endpoint") if server else None
    if endpoint:
        return f"otlp: batches straight to {endpoint} (advertised by the server)"
    why = (
        "the server advertises no trace endpoint"
        if server and server.get("reachable")
        else "the server's trace endpoint is not known"
    )
    return f"hub: rl_insight.trace_span per span ({why}; rl_insight_transport={config.rl_insight_transport})"
