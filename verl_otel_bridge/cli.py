"""The ``verl-otel-bridge`` command: ``doctor``, ``demo``, ``show`` and ``replay``.

``doctor``
    Installed versions, the resolved configuration and where each value came
    from (secrets masked), which exporter ``auto`` would choose and why, and
    whether the RL-Insight server answers. Exit code 0 when spans would reach
    the preferred exporter, 1 otherwise; ``--json`` for scripts.
``demo``
    The simulated, traced agent loop of :mod:`verl_otel_bridge.demo`.
``show FILE.jsonl``
    The span tree of a JSON Lines capture (``exporter: jsonl``).
``replay FILE.jsonl --to rl_insight|otlp|console``
    Re-export a capture recorded offline, with the original ids and times.

The command line needs the ``cli`` extra (``click`` and ``rich``). They are
imported only inside :func:`main` and :func:`build_cli`, so the functions that
do the work (:func:`diagnose`, :func:`record_to_span`, :func:`read_records`,
:func:`replay_records`) are usable without them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sys
import types
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlparse

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from verl_otel_bridge import __version__, rl_insight_compat
from verl_otel_bridge.accounting import SpanCounts
from verl_otel_bridge.config import BridgeConfig, value_sources
from verl_otel_bridge.exporters.rl_insight_otlp import SERVICES_PATH, TRACES_PATH

if TYPE_CHECKING:
    import click

#: What to run when the ``cli`` extra is missing.
INSTALL_HINT = "pip install 'verl-otel-bridge[cli]'"

#: How long ``doctor`` waits for the RL-Insight server.
SERVER_TIMEOUT_S = 2.0

#: Files at least this large get a progress bar in ``replay``.
PROGRESS_MIN_BYTES = 1 << 20

#: Keys whose values are never shown (case-insensitive substring match).
SECRET_KEY_PARTS = ("header", "token", "secret", "password")
MASK = "***"
#: Shorter secrets are masked where they appear as values, but not searched for in other text.
_MIN_SCRUBBED = 4
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s]+)@")

_HEX = re.compile(r"[0-9a-f]+")


# -- secrets -------------------------------------------------------------------


def is_secret_key(key: object) -> bool:
    """True for keys whose values must not be shown (``*header*``, ``*token*``, ``*secret*``, ``*password*``)."""
    lowered = str(key).lower()
    return any(part in lowered for part in SECRET_KEY_PARTS)


def mask_url(text: str) -> str:
    """``text`` with the user information of every URL in it (``user:password@``) replaced by ``***@``."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def masked(key: object, value: Any) -> Any:
    """``value`` safe to show under ``key``: secret keys masked at any depth, URL user information removed."""
    if is_secret_key(key) and value not in (None, "", (), [], {}):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): masked(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(key, v) for v in value]
    if isinstance(value, str):
        return mask_url(value)
    return value


def _secrets_in(value: Any, key: object = "") -> set[str]:
    """Every string in ``value`` that :func:`masked` would hide, to scrub it from any other text."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            found |= _secrets_in(v, k)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= _secrets_in(v, key)
    elif isinstance(value, str):
        if is_secret_key(key) and len(value) >= _MIN_SCRUBBED:
            found.add(value)
        for match in _USERINFO.finditer(value):
            userinfo = match.group("userinfo")
            found.add(userinfo)
            password = userinfo.partition(":")[2]
            if len(password) >= _MIN_SCRUBBED:
                found.add(password)
    return found


def _environment_secrets(environ: Mapping[str, str]) -> set[str]:
    """Secrets in the variables the bridge reads, for when the configuration does not even resolve."""
    found: set[str] = set()
    for name, raw in environ.items():
        if not (name.startswith(("VERL_OTEL_BRIDGE_", "OTEL_")) or name == rl_insight_compat.SERVER_URL_ENV):
            continue
        found |= _secrets_in(raw, name)
        if name.endswith("RL_INSIGHT_CONFIG"):
            try:
                found |= _secrets_in(json.loads(raw))
            except ValueError:
                if len(raw) >= _MIN_SCRUBBED:
                    found.add(raw)  # unreadable JSON may hold anything: never echo it
    return found


def _scrub(value: Any, secrets: set[str]) -> Any:
    """``value`` with every secret string replaced by ``***`` in every string it holds."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in sorted(secrets, key=len, reverse=True):
            value = value.replace(secret, MASK)
        return value
    if isinstance(value, Mapping):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    return value


# -- doctor ----------------------------------------------------------------------


def _distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` from package metadata (nothing is imported)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata is "unknown", not a crash
        return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _otlp_http_available() -> bool:
    return _has_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")


@contextlib.contextmanager
def _ray_as_in_training(ray_installed: bool) -> Iterator[bool]:
    """Answer RL-Insight's "is Ray initialized?" as the training process would.

    ``doctor`` runs in its own process, where nobody called ``ray.init()``; the
    training job (verl's trainer and its workers) does. When Ray is installed but
    not imported here, a stand-in that says "initialized" is put in
    ``sys.modules["ray"]`` while :func:`rl_insight_compat.check_runtime` runs, so
    the check does not import Ray (slow) to learn what is always false here.
    Yields True when the stand-in was used.
    """
    if sys.modules.get("ray") is not None or not ray_installed:
        yield False
        return
    absent = object()
    previous = sys.modules.get("ray", absent)
    stand_in = types.ModuleType("ray")
    stand_in.is_initialized = lambda: True  # type: ignore[attr-defined]
    sys.modules["ray"] = stand_in
    try:
        yield True
    finally:
        if sys.modules.get("ray") is stand_in:
            if previous is absent:
                del sys.modules["ray"]
            else:
                sys.modules["ray"] = previous  # type: ignore[assignment]


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
    base = server_url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}{SERVICES_PATH}", timeout=timeout_s) as response:  # noqa: S310
            body = response.read()
        data = json.loads(body.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{SERVICES_PATH} answered a JSON {type(data).__name__}, not an object")
    except (OSError, ValueError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    result["reachable"] = True
    result["status"] = data.get("status")
    result["ports"] = {k: v for k, v in data.items() if k.endswith("_port")}
    port = data.get("otlp_port")
    result["otlp_port"] = port
    if port:
        parsed = urlparse(base)
        host = parsed.hostname or ""
        host = f"[{host}]" if ":" in host else host
        try:
            result["trace_endpoint"] = f"{parsed.scheme or 'http'}://{host}:{int(port)}{TRACES_PATH}"
        except (TypeError, ValueError):
            result["error"] = f"otlp_port {port!r} is not a port number"
    return result


_HINTS = {
    "not_installed": "install RL-Insight: pip install 'verl-otel-bridge[rl-insight]'",
    "import_failed": "repair the rl-insight installation (importing it fails; see the detail)",
    "no_version": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "version_unparsable": "reinstall RL-Insight so its package metadata is present: pip install --force-reinstall 'rl-insight>=0.3.0'",
    "version_too_old": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "no_trace_span": "upgrade RL-Insight: pip install -U 'rl-insight>=0.3.0'",
    "no_server_url": "set RL_INSIGHT_SERVER_URL (or VERL_OTEL_BRIDGE_RL_INSIGHT_SERVER_URL) to the RL-Insight server, "
    "e.g. http://<host>:<port>",
    "ray_not_initialized": "install Ray (pip install ray); RL-Insight exports only from processes where ray.init() ran",
}


def _local_check(name: str, config: BridgeConfig, environ: Mapping[str, str]) -> dict[str, Any]:
    """What a local exporter would do with spans, and whether the bridge could build it."""
    check: dict[str, Any] = {"exporter": name, "ok": True, "detail": ""}
    if name == "memory":
        check["detail"] = f"kept in this process only (the newest {config.memory_max_spans})"
    elif name == "console":
        check["detail"] = "one JSON line per span on standard output"
    elif name == "none":
        check["detail"] = "discarded"
    elif name == "jsonl":
        path = Path(config.jsonl_path).expanduser()
        target = path if path.exists() else next((p for p in path.absolute().parents if p.exists()), Path("/"))
        writable = (path.is_file() or not path.exists()) and os.access(target, os.W_OK)
        check["ok"] = writable
        check["detail"] = f"appended to {path}" if writable else f"{path} is not writable"
    elif name == "otlp":
        endpoint = (
            config.otlp_endpoint
            or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or (environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else None)
            or f"http://localhost:4318{TRACES_PATH}"
        )
        if _otlp_http_available():
            check["detail"] = f"OTLP/HTTP to {mask_url(endpoint)}"
        else:
            check["ok"] = False
            check["detail"] = (
                "needs opentelemetry-exporter-otlp-proto-http: pip install 'verl-otel-bridge[otlp]'"
            )
    return check


def diagnose(environ: Mapping[str, str] | None = None, *, timeout_s: float = SERVER_TIMEOUT_S) -> dict[str, Any]:
    """Everything ``doctor`` reports, as a JSON-ready dict; ``ok`` says whether spans reach the preferred exporter.

    Uses the same checks as the RL-Insight exporter
    (:func:`rl_insight_compat.probe_module` and :func:`rl_insight_compat.check_runtime`)
    without calling ``rl_insight.init``. Ray counts as initialized when it is
    installed (the training process runs ``ray.init()``, this one does not).
    Secrets never appear in the result.

    Keys: ``ok``, ``versions``, ``config`` (``error``, ``values``: key ->
    ``{value, source}``), ``route`` (where spans go and why; None when the
    configuration does not resolve), ``server`` (the RL-Insight server check;
    None without a server URL), ``problems``, ``hints``.
    """
    env = os.environ if environ is None else environ
    problems: list[str] = []
    hints: list[str] = []
    report: dict[str, Any] = {
        "ok": False,
        "versions": {},
        "config": None,
        "route": None,
        "server": None,
        "problems": problems,
        "hints": hints,
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
    ray_version = _distribution_version("ray")
    report["versions"] = {
        "python": platform.python_version(),
        "verl-otel-bridge": __version__,
        "opentelemetry-api": _distribution_version("opentelemetry-api"),
        "opentelemetry-sdk": _distribution_version("opentelemetry-sdk"),
        "opentelemetry-exporter-otlp-proto-http": _distribution_version("opentelemetry-exporter-otlp-proto-http"),
        "rl-insight": static.installed or rl_insight_compat._installed_version(),  # the probe's metadata lookup
        "rl_insight.__version__": static.version,
        "ray": ray_version,
    }
    if config is None:
        return _scrub(report, _environment_secrets(env))

    values = config.to_dict()
    secrets = _secrets_in(values)
    report["config"] = {
        "error": None,
        "values": {key: {"value": masked(key, value), "source": sources[key]} for key, value in values.items()},
    }
    server_url = config.rl_insight_server_url or rl_insight_compat.config_server_url(config.rl_insight_config)
    if server_url:
        report["server"] = check_server(server_url, timeout_s)
    server = report["server"]

    primary, *copies = config.exporters
    wants = primary == "rl_insight" or (primary == "auto" and config.rl_insight_enable is not False)
    explicit = primary == "rl_insight" or config.rl_insight_enable is True
    route: dict[str, Any] = {
        "exporter": list(config.exporters) if copies else primary,
        "rl_insight_wanted": ("explicitly" if explicit else "if usable") if wants else "no",
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
            detail="tracing is disabled (enabled=false or OTEL_SDK_DISABLED=true): every span API is a no-op",
        )
        report["ok"] = True
        return _scrub(report, secrets)

    if wants:
        with _ray_as_in_training(ray_version is not None) as assumed:
            probe = rl_insight_compat.check_runtime(static, server_url)
        if static.usable and server_url:
            route["ray"] = (
                f"ray {ray_version} is installed; RL-Insight also needs ray.init() in the process that exports "
                "(verl's trainer and workers run it), which is assumed here"
                if assumed
                else "initialized in this process"
                if probe.usable
                else "not installed"
            )
        why = (
            "exporter=rl_insight"
            if primary == "rl_insight"
            else "exporter=auto with rl_insight_enable=true"
            if explicit
            else "exporter=auto (RL-Insight when usable, else the fallback)"
        )
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
            problems.append(f"RL-Insight is not usable ({probe.reason}): {probe.detail}")
            if probe.reason in _HINTS:
                hints.append(_HINTS[probe.reason])
        local = config.fallback
    else:
        local = config.fallback if primary == "auto" else primary
        route.update(
            preferred=local,
            destination=local,
            reason="configured",
            detail=(
                f"exporter=auto with rl_insight_enable=false (VERL_RL_INSIGHT_ENABLE=0), so the fallback {local!r}"
                if primary == "auto"
                else f"exporter={local!r} configured"
            ),
        )
    for index, name in enumerate([local, *copies]):
        check = _local_check(name, config, env)
        if index == 0:
            route["local"] = check  # the fallback when RL-Insight is wanted, else the exporter itself
        else:
            route["copies"].append(check)
        if not check["ok"]:
            role = "copy" if index else ("fallback" if wants else "exporter")
            problems.append(f"{role} {name!r} cannot be used: {check['detail']}")
    report["ok"] = route["destination"] == route["preferred"] and not problems
    return _scrub(report, secrets)


def _transport(config: BridgeConfig, server: dict[str, Any] | None) -> str:
    if config.rl_insight_transport == "hub":
        return "hub: rl_insight.trace_span per span (rl_insight_transport=hub)"
    endpoint = server.get("trace_endpoint") if server else None
    if endpoint and _otlp_http_available():
        return f"otlp: batches straight to {endpoint} (advertised by the server)"
    why = (
        "opentelemetry-exporter-otlp-proto-http is not installed" if endpoint
        else "the server advertises no trace endpoint" if server and server.get("reachable")
        else "the server's trace endpoint is not known"
    )
    return f"hub: rl_insight.trace_span per span ({why}; rl_insight_transport={config.rl_insight_transport})"


# -- records -> spans ------------------------------------------------------------


def record_to_span(record: Mapping[str, Any]) -> ReadableSpan:
    """Rebuild the ``ReadableSpan`` a record of :mod:`verl_otel_bridge.records` describes.

    Ids, nanosecond times, kind, status, attributes (JSON lists become tuples),
    events, resource and scope name are restored exactly, so
    ``span_to_record(record_to_span(r)) == r`` for any record the bridge wrote.

    Raises:
        ValueError: the record lacks a field or a field has the wrong form.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"a span record is a JSON object, not {type(record).__name__}")
    try:
        name = record["name"]
        if not isinstance(name, str):
            raise ValueError(f"name is {type(name).__name__}, not a string")
        trace_id = _hex_id(record.get("trace_id"), 32, "trace_id")
        span_id = _hex_id(record.get("span_id"), 16, "span_id")
        parent_id = _hex_id(record.get("parent_span_id"), 16, "parent_span_id")
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = (
            SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)
            if trace_id is not None and span_id is not None
            else None
        )
        parent = SpanContext(trace_id or 0, parent_id, is_remote=False, trace_flags=flags) if parent_id is not None else None
        start, end = _time(record.get("start_time_ns"), "start_time_ns"), _time(record.get("end_time_ns"), "end_time_ns")
        kind = SpanKind[str(record.get("kind") or "INTERNAL")]
        status = record.get("status") or {}
        if not isinstance(status, Mapping):
            raise ValueError("status is not an object")
        status_obj = Status(StatusCode[str(status.get("code") or "UNSET")], status.get("description"))
        events = [
            Event(
                str(event["name"]),
                _attributes(event.get("attributes"), "event attributes"),
                _time(event.get("time_ns"), "event time_ns"),
            )
            for event in (record.get("events") or [])
        ]
        resource = Resource(dict(_attributes(record.get("resource"), "resource") or {}))
        scope = record.get("scope")
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=resource,
            attributes=_attributes(record.get("attributes"), "attributes"),
            events=events,
            kind=kind,
            status=status_obj,
            start_time=start,
            end_time=end,
            instrumentation_scope=InstrumentationScope(str(scope)) if scope is not None else None,
        )
    except KeyError as exc:
        raise ValueError(f"missing or unknown value {exc}") from None
    except (TypeError, AttributeError) as exc:
        raise ValueError(str(exc)) from None


def _hex_id(value: Any, width: int, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != width or not _HEX.fullmatch(value):
        raise ValueError(f"{what} must be {width} lowercase hex digits, not {value!r}")
    return int(value, 16)


def _time(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be integer nanoseconds, not {value!r}")
    return value


def _attributes(value: Any, what: str) -> BoundedAttributes | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is not an object")
    plain = {str(k): tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return BoundedAttributes(maxlen=None, attributes=plain, immutable=True, max_value_len=None)


@dataclass
class ReadResult:
    """What :func:`read_records` found: good records and the bad lines (number, reason)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)


def iter_lines(stream: IO[bytes]) -> Iterator[tuple[int, int, dict[str, Any] | None, str | None]]:
    """``(line number, bytes read, record or None, error or None)`` for each non-blank line."""
    for number, raw in enumerate(stream, start=1):
        size = len(raw)
        text = raw.strip()
        if not text:
            continue
        try:
            record = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            yield number, size, None, f"not JSON ({exc})"
            continue
        problem = _record_problem(record)
        yield number, size, (None if problem else record), problem


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a span record"
    if not isinstance(record.get("name"), str):
        return "no span name"
    if not isinstance(record.get("span_id"), str):
        return "no span_id"
    if not isinstance(record.get("attributes", {}), dict):
        return "attributes is not an object"
    if not isinstance(record.get("status", {}) or {}, dict):
        return "status is not an object"
    return None


def read_records(path: str | os.PathLike[str]) -> ReadResult:
    """Parse a JSONL capture; lines that are not span records are counted, not fatal."""
    result = ReadResult()
    with open(path, "rb") as stream:
        for number, _size, record, problem in iter_lines(stream):
            if record is None:
                result.bad.append((number, problem or "unreadable"))
            else:
                result.records.append({"attributes": {}, **record})
    return result


# -- replay ----------------------------------------------------------------------


@dataclass
class ReplaySummary:
    """Outcome of :func:`replay_records`: every span read lands in exactly one of exported, fallback, failed."""

    read: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def exported(self) -> int:
        return int(sum(self.counters.get("exported", {}).values()))

    @property
    def fallback(self) -> int:
        return int(self.counters.get("fallback", 0))

    @property
    def failed(self) -> int:
        return int(self.counters.get("failed", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "bad_lines": len(self.bad),
            "exported": self.exported,
            "fallback": self.fallback,
            "failed": self.failed,
            "exported_by": dict(self.counters.get("exported", {})),
        }


def replay_records(
    stream: IO[bytes],
    exporter: SpanExporter,
    counts: SpanCounts,
    *,
    batch_size: int,
    on_progress: Callable[[int], None] | None = None,
) -> ReplaySummary:
    """Read records from ``stream`` and hand them to ``exporter`` in batches of ``batch_size``.

    ``exporter`` must count its outcomes in ``counts`` (``exported.<name>``,
    ``fallback``, ``failed``), as the bridge's exporters do; an exception from
    it counts the batch as failed. Lines that are not records, or records that
    cannot be rebuilt, are listed in ``bad``.
    """
    summary = ReplaySummary()
    batch: list[ReadableSpan] = []

    def flush() -> None:
        if not batch:
            return
        try:
            exporter.export(list(batch))
        except Exception:  # noqa: BLE001 - one bad batch must not end the replay
            counts.add("failed", len(batch))
        batch.clear()

    for number, size, record, problem in iter_lines(stream):
        if on_progress is not None:
            on_progress(size)
        if record is None:
            summary.bad.append((number, problem or "unreadable"))
            continue
        try:
            span = record_to_span(record)
        except ValueError as exc:
            summary.bad.append((number, str(exc)))
            continue
        summary.read += 1
        batch.append(span)
        if len(batch) >= batch_size:
            flush()
    flush()
    with contextlib.suppress(Exception):
        exporter.force_flush()
    summary.counters = counts.snapshot()
    return summary


def _start_ray_for(config: BridgeConfig, say: Callable[[str], None]) -> Any:
    """Start (or join, with ``RAY_ADDRESS``) Ray when RL-Insight is otherwise usable; the module, or None."""
    static = rl_insight_compat.probe_module(config.rl_insight_min_version)
    url = config.rl_insight_server_url or rl_insight_compat.config_server_url(config.rl_insight_config)
    if not static.usable or not url:
        return None
    ray = sys.modules.get("ray")
    if ray is None:
        if _distribution_version("ray") is None:
            return None
        ray = importlib.import_module("ray")
    if ray.is_initialized():
        return None
    say("starting Ray: RL-Insight exports only from a process where Ray is initialized (--no-init-ray to skip)")
    ray.init(include_dashboard=False, log_to_driver=False)
    return ray


# -- command line ----------------------------------------------------------------


def _missing_dependency() -> str | None:
    for name in ("click", "rich"):
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``verl-otel-bridge`` console script."""
    missing = _missing_dependency()
    if missing is not None:
        print(
            f"verl-otel-bridge: the command line needs {missing!r}, which is not installed; "
            f"install it with: {INSTALL_HINT}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    build_cli().main(args=list(argv) if argv is not None else None, prog_name="verl-otel-bridge")


def build_cli() -> click.Group:
    """The ``click`` command group (needs the ``cli`` extra)."""
    import click
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def out() -> Console:
        return Console(highlight=False, soft_wrap=False)

    def err() -> Console:
        return Console(stderr=True, highlight=False)

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="verl-otel-bridge")
    def cli() -> None:
        """OpenTelemetry spans for verl agent loops: check the setup, run the demo, read and replay captures."""

    @cli.command()
    @click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
    @click.option("--timeout", default=SERVER_TIMEOUT_S, show_default=True, type=float, help="Seconds to wait for the RL-Insight server.")
    @click.pass_context
    def doctor(ctx: click.Context, as_json: bool, timeout: float) -> None:
        """Versions, configuration, where spans would go and why; exit 1 if not to the preferred exporter."""
        report = diagnose(timeout_s=timeout)
        if as_json:
            click.echo(json.dumps(report, indent=2, default=str))
        else:
            _render_doctor(out(), report)
        ctx.exit(0 if report["ok"] else 1)

    @cli.command()
    def demo() -> None:
        """Run the simulated, traced multi-turn agent loop (the same as ``make demo``)."""
        from verl_otel_bridge.demo import main as demo_main

        demo_main()

    @cli.command()
    @click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--max-attributes", default=6, show_default=True, type=click.IntRange(min=0), help="Attributes shown per span.")
    def show(file: Path, max_attributes: int) -> None:
        """Print the span tree of a JSON Lines capture (exporter: jsonl); bad lines are counted, not fatal."""
        from verl_otel_bridge.tree import render_tree

        result = read_records(file)
        if result.records:
            click.echo(render_tree(result.records, max_attributes=max_attributes))
        _report_bad(err(), result.bad)
        traces = len({r.get("trace_id") for r in result.records})
        err().print(Text(f"{len(result.records)} spans in {traces} traces; {len(result.bad)} bad lines"))

    @cli.command()
    @click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--to", "target", required=True, type=click.Choice(["rl_insight", "otlp", "console"]), help="Where to send the spans.")
    @click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Spans per export call [default: max_export_batch_size, 512].")
    @click.option("--init-ray/--no-init-ray", default=True, show_default=True, help="For rl_insight: start Ray if RL-Insight needs it and it is not running.")
    @click.pass_context
    def replay(ctx: click.Context, file: Path, target: str, batch_size: int | None, init_ray: bool) -> None:
        """Re-export a JSONL capture, with its original ids and times, to RL-Insight, OTLP or the console."""
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        from verl_otel_bridge.exporters.counting import CountingSpanExporter
        from verl_otel_bridge.exporters.named import named_exporter
        from verl_otel_bridge.exporters.rl_insight import RLInsightSpanExporter

        console = err()
        try:
            config = BridgeConfig.resolve()
        except ValueError as exc:
            console.print(Text(str(exc)))
            ctx.exit(2)
        counts = SpanCounts()
        ray = None
        if target == "rl_insight":
            if init_ray:
                try:
                    ray = _start_ray_for(config, lambda line: console.print(Text(line)))
                except Exception as exc:  # noqa: BLE001
                    console.print(Text(f"starting Ray failed ({type(exc).__name__}: {exc}); RL-Insight will be unusable"))
            exporter: SpanExporter = RLInsightSpanExporter(config=config, counts=counts)
        else:
            try:
                exporter = CountingSpanExporter(named_exporter(target, config), counts, f"exported.{target}")
            except ValueError as exc:
                console.print(Text(str(exc)))
                ctx.exit(2)
        size = file.stat().st_size
        progress = Progress(
            TextColumn("replaying"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
            console=console, transient=True, disable=size < PROGRESS_MIN_BYTES,
        )
        try:
            with progress, open(file, "rb") as stream:
                task = progress.add_task("replay", total=size)
                summary = replay_records(
                    stream, exporter, counts,
                    batch_size=batch_size or config.max_export_batch_size,
                    on_progress=lambda n: progress.advance(task, n),
                )
            route = exporter.status() if isinstance(exporter, RLInsightSpanExporter) else None
        finally:
            with contextlib.suppress(Exception):
                exporter.shutdown()
            if ray is not None:
                with contextlib.suppress(Exception):
                    ray.shutdown()
        _report_bad(console, summary.bad)
        table = Table(title=f"replay {file.name} -> {target}", show_header=True)
        for column in ("read", "bad lines", "exported", "fallback", "failed"):
            table.add_column(column, justify="right")
        table.add_row(*(str(v) for v in (summary.read, len(summary.bad), summary.exported, summary.fallback, summary.failed)))
        console.print(table)
        if route is not None and summary.fallback:
            console.print(Text(
                f"RL-Insight was not usable ({route['reason']}): {route['detail']}; {summary.fallback} spans went to "
                f"the {config.fallback} fallback" + (" and are gone when this command exits" if config.fallback == "memory" else "")
                + ". See: verl-otel-bridge doctor"
            ))
        ctx.exit(0 if summary.failed == 0 and summary.fallback == 0 else 1)

    return cli


def _report_bad(console: Any, bad: Sequence[tuple[int, str]], shown: int = 5) -> None:
    from rich.text import Text

    for number, problem in bad[:shown]:
        console.print(Text(f"line {number}: {problem}"))
    if len(bad) > shown:
        console.print(Text(f"... and {len(bad) - shown} more bad lines"))


def _render_doctor(console: Any, report: Mapping[str, Any]) -> None:
    """``doctor``'s report for people: tables for versions and configuration, then the route and the verdict."""
    from rich.table import Table
    from rich.text import Text

    def say(line: str, style: str = "") -> None:
        console.print(Text(line, style=style))  # Text: values are never read as rich markup

    versions = Table(title="Installed")
    versions.add_column("component")
    versions.add_column("version")
    for name, version in report["versions"].items():
        missing = "-" if name == "rl_insight.__version__" else "not installed"
        versions.add_row(Text(name), Text(missing if version is None else str(version)))
    console.print(versions)

    config = report["config"]
    table = Table(title="Configuration (secrets masked)")
    table.add_column("key")
    table.add_column("value")
    table.add_column("from")
    for key, entry in config["values"].items():
        value = entry["value"]
        table.add_row(Text(key), Text(value if isinstance(value, str) else json.dumps(value, default=str)), Text(entry["source"]))
    console.print(table)
    if config["error"]:
        say(f"configuration error: {config['error']}", "bold red")

    route = report["route"]
    if route is not None:
        say("Where spans go", "bold")
        exporter = route["exporter"]
        say(f"  exporter: {', '.join(exporter) if isinstance(exporter, list) else exporter} "
            f"(RL-Insight wanted: {route['rl_insight_wanted']})")
        say(f"  spans go to: {route['destination']} (preferred: {route['preferred']}; reason: {route['reason']})")
        say(f"  why: {route['detail']}")
        if route["transport"]:
            say(f"  transport: {route['transport']}")
        if route["ray"]:
            say(f"  ray: {route['ray']}")
        local = route["local"]
        if local is not None:
            role = "fallback" if route["preferred"] == "rl_insight" else "exporter"
            say(f"  {role} {local['exporter']}: {local['detail']}")
        for copy in route["copies"]:
            say(f"  copy to {copy['exporter']}: {copy['detail']}")

        say("RL-Insight server", "bold")
        server = report["server"]
        if server is None:
            say("  no server URL set (RL_INSIGHT_SERVER_URL)")
        elif server["reachable"]:
            ports = ", ".join(f"{k}={v}" for k, v in server["ports"].items()) or "none"
            say(f"  {server['url']}: reachable (status {server['status']}); otlp_port={server['otlp_port']}; "
                f"advertised ports: {ports}")
            if server["trace_endpoint"]:
                say(f"  trace endpoint: {server['trace_endpoint']}")
        else:
            say(f"  {server['url']}: not reachable ({server['error']})")

    for problem in report["problems"]:
        say(f"problem: {problem}", "red")
    for hint in report["hints"]:
        say(f"fix: {hint}")
    if report["ok"]:
        say(f"OK: spans reach {route['destination']}", "bold green")
    else:
        say("NOT OK: spans would not reach the preferred exporter", "bold red")


if __name__ == "__main__":
    main()
