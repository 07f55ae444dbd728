"""Bridge configuration: one frozen object, resolved once, validated early.

Precedence, highest first: keyword overrides, the mapping passed to
``configure()``, environment variables, defaults. Every key can be set from the
environment as ``VERL_OTEL_BRIDGE_<KEY>``; a few keys also read the variables
their ecosystem already uses (verl's ``VERL_RL_INSIGHT_ENABLE``, RL-Insight's
``RL_INSIGHT_SERVER_URL``, OpenTelemetry's ``OTEL_*``). The prefixed variable
wins over those aliases.

Mistakes raise :class:`ValueError` naming the key, the value and the fix, so a
training job fails at start-up instead of running unobserved.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import unquote

from packaging.version import InvalidVersion, Version

from verl_otel_bridge.secrets import masked

ENV_PREFIX = "VERL_OTEL_BRIDGE_"

#: Where spans can go. ``auto`` means RL-Insight when usable, else ``fallback``.
EXPORTERS = ("auto", "rl_insight", "otlp", "console", "memory", "jsonl", "none")
#: Where spans go when RL-Insight is wanted but not usable.
FALLBACKS = ("memory", "console", "jsonl", "none")
#: How spans reach RL-Insight's trace store.
TRANSPORTS = ("auto", "hub", "otlp")

#: The longest any wait setting may be: beyond it a thread's wait overflows, and no
#: training job wants an exporter to wait longer.
MAX_WAIT_S = 3600

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def default_spill_dir() -> str:
    """Where spill files go unless ``spill_dir`` says otherwise: ``<tmp>/verl_otel_bridge_spill``."""
    return os.path.join(tempfile.gettempdir(), "verl_otel_bridge_spill")


def _env_aliases() -> dict[str, tuple[str, ...]]:
    return {
        "enabled": ("OTEL_SDK_DISABLED",),
        "service_name": ("OTEL_SERVICE_NAME",),
        "rl_insight_enable": ("VERL_RL_INSIGHT_ENABLE",),
        "rl_insight_server_url": ("RL_INSIGHT_SERVER_URL",),
        "max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE",),
        "max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",),
        "schedule_delay_ms": ("OTEL_BSP_SCHEDULE_DELAY",),
    }


# Variables whose meaning is the inverse of the key they feed.
_INVERTED_ALIASES = frozenset({"OTEL_SDK_DISABLED"})


@dataclass(frozen=True)
class BridgeConfig:
    """Everything the bridge can be told. Build it with :meth:`resolve`.

    Attributes:
        enabled: ``False`` turns every span API into a cheap no-op (also set by
            ``OTEL_SDK_DISABLED=true``).
        exporter: ``auto`` (RL-Insight when usable, else ``fallback``),
            ``rl_insight``, ``otlp`` (any OTLP/HTTP collector, configured by the
            ``OTEL_EXPORTER_OTLP_*`` variables or ``otlp_endpoint``), ``console``,
            ``memory``, ``jsonl`` or ``none``; or a list (comma-separated in the
            environment): the first is the primary destination, the others get
            copies (``auto``/``rl_insight`` can only be first).
        fallback: where spans go when RL-Insight is wanted but unusable:
            ``memory``, ``console``, ``jsonl`` or ``none``.
        jsonl_path: file the ``jsonl`` exporter appends to.
        otlp_endpoint: traces URL for the ``otlp`` exporter (default: its
            ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``).
        memory_max_spans: the in-memory exporter keeps only this many of the
            most recent spans.
        project: RL-Insight project and the identity's default ``project``.
        experiment_name: RL-Insight experiment and the identity's default
            ``experiment_name``.
        service_name: OpenTelemetry ``service.name`` of the bridge's resource
            (from ``OTEL_SERVICE_NAME``, else ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``).
        rl_insight_enable: ``True`` asks for RL-Insight explicitly (a WARNING
            when unusable), ``False`` keeps ``auto`` local, ``None`` lets ``auto``
            probe. Read from verl's ``VERL_RL_INSIGHT_ENABLE``.
        rl_insight_server_url: RL-Insight server; defaults to
            ``RL_INSIGHT_SERVER_URL``.
        rl_insight_min_version: the oldest RL-Insight the bridge forwards to.
        rl_insight_config: passed as ``config=`` to ``rl_insight.init``.
        rl_insight_transport: how spans reach RL-Insight's trace store: ``hub``
            (``rl_insight.trace_span`` per span), ``otlp`` (batches straight to the
            endpoint its server advertises) or ``auto`` (otlp when discovered).
        max_queue_size: at most this many spans wait in memory for export
            (``OTEL_BSP_MAX_QUEUE_SIZE``); unset: bounded by ``max_queue_bytes`` only.
            Beyond either bound new spans are spilled (see ``spill_dir``).
        max_queue_bytes: estimated bytes of spans waiting in memory for export
            (:mod:`verl_otel_bridge.export.budget`); beyond it new spans are spilled.
        max_export_batch_size: spans handed to the exporter at once.
        schedule_delay_ms: longest wait before queued spans are exported.
        shutdown_timeout_s: longest ``shutdown()`` waits for pending exports.
        max_attribute_length: longer string attribute values are truncated,
            with a marker saying how much was cut.
        max_attribute_items: longer sequence attribute values (token-id lists)
            keep their first this many items (counted as ``converted``).
        spill_dir: directory of the spill files (unset: :func:`default_spill_dir`; one per process,
            ``spill-<host>-<pid>-<n>.jsonl``): spans past the in-memory bound, and
            spans the destination refused, wait there to be sent again.
        spill_max_bytes: the spill files' total size at most; 0 turns spilling
            off. Past it spans are dropped.
        spill_after_s: once the destination has refused every batch for this
            long, batches go straight to the spill (one probe batch every
            ``spill_probe_s``) instead of waiting out the sender's retries.
        spill_probe_s: while the destination is down, how often a batch is tried.
        session_sample_rate: the fraction of session groups (by ``uid``) kept,
            0 to 1; spans of a session are held until its ``agent_session`` span
            ends, then kept or dropped together (``sampled_out``).
        session_keep_slowest: also keep a session among the slowest this
            fraction of its step's sessions ended so far (0: off).
        session_keep_reward_extremes: also keep a session whose reward is among
            the highest or the lowest this fraction of its step's so far (0: off).
        session_hold_max_bytes: estimated bytes of spans held for sampling at
            most; past it the oldest session's spans are released, kept.
        redact_attributes: attribute keys whose values are replaced by
            ``[REDACTED]`` before any exporter sees them (e.g. ``content``,
            ``reasoning``, ``tool_args``, ``gen_ai.tool.call.arguments``).
        reminder_interval_s: while RL-Insight stays unusable, a reminder is
            logged this often.
        handle_sigterm: on SIGTERM, flush queued spans (within
            ``shutdown_timeout_s``) before the process stops as it otherwise would
            (see :mod:`verl_otel_bridge.signals`); only bridges made in the main thread.
        progress_interval_s: every session open longer than this exports an
            ``agent_session.progress`` span this often, so a hung session is
            visible while it hangs; 0 turns it off.
        straggler_factor: log (at most once per step) the sessions open longer
            than this many times the median duration of their step's finished
            sessions; 0 turns it off.
    """

    enabled: bool = True
    exporter: str | tuple[str, ...] = "auto"
    fallback: str = "memory"
    jsonl_path: str = "verl_otel_spans.jsonl"
    otlp_endpoint: str | None = None
    memory_max_spans: int = 10_000
    project: str | None = None
    experiment_name: str | None = None
    service_name: str = "verl_otel_bridge"
    rl_insight_enable: bool | None = None
    rl_insight_server_url: str | None = None
    rl_insight_min_version: str = "0.3.0"
    rl_insight_config: Mapping[str, Any] | None = field(default=None, hash=False)
    rl_insight_transport: str = "auto"
    max_queue_size: int | None = None
    max_queue_bytes: int = 256 * 1024 * 1024
    max_export_batch_size: int = 512
    schedule_delay_ms: int = 1000
    shutdown_timeout_s: float = 10.0
    max_attribute_length: int = 32_768
    max_attribute_items: int = 32_768
    spill_dir: str | None = None
    spill_max_bytes: int = 1024 * 1024 * 1024
    spill_after_s: float = 60.0
    spill_probe_s: float = 5.0
    session_sample_rate: float = 1.0
    session_keep_slowest: float = 0.0
    session_keep_reward_extremes: float = 0.0
    session_hold_max_bytes: int = 64 * 1024 * 1024
    redact_attributes: tuple[str, ...] = ()
    reminder_interval_s: float = 600.0
    handle_sigterm: bool = True
    progress_interval_s: float = 60.0
    straggler_factor: float = 3.0

    def __post_init__(self) -> None:
        _validate(self)

    def __repr__(self) -> str:
        # Like the dataclass repr, with secrets masked (URL passwords, tokens in rl_insight_config).
        shown = ", ".join(f"{f.name}={masked(f.name, getattr(self, f.name))!r}" for f in fields(self))
        return f"BridgeConfig({shown})"

    @property
    def exporters(self) -> tuple[str, ...]:
        """``exporter`` as a tuple: the primary first, then the ones that get copies."""
        return (self.exporter,) if isinstance(self.exporter, str) else tuple(self.exporter)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """All configuration keys, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def resolve(
        cls,
        config: Mapping[str, Any] | BridgeConfig | None = None,
        /,
        *,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> BridgeConfig:
        """Merge overrides > ``config`` > environment > defaults.

        A ``BridgeConfig`` given as ``config`` is taken whole (the environment
        is not read again); overrides still apply on top.

        Raises:
            ValueError: an unknown key, or a value of the wrong type or range.
        """
        if isinstance(config, BridgeConfig):
            return dataclasses.replace(config, **_coerce_all(overrides, "keyword")) if overrides else config
        env = os.environ if environ is None else environ
        values = from_environment(env)
        if config is not None:
            if not isinstance(config, Mapping):
                raise ValueError(f"configure() takes a mapping or a BridgeConfig, not {type(config).__name__}")
            values.update(_coerce_all(config, "config"))
        values.update(_coerce_all(overrides, "keyword"))
        _fit_batch_to_queue(values)
        try:
            return cls(**values)
        except ValueError as exc:
            sources = value_sources(config if isinstance(config, Mapping) else None, environ=env, **overrides)
            key = key_named(exc)
            if key is None or sources[key] == "default":
                raise
            raise ValueError(f"{exc} (set by {sources[key]})") from None

    @classmethod
    def from_verl(
        cls, verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> BridgeConfig:
        """Build the config from a verl trainer config (a mapping or OmegaConf ``DictConfig``).

        Reads ``trainer.project_name`` -> ``project``, ``trainer.experiment_name``
        -> ``experiment_name``, ``trainer.logger`` (RL-Insight is wanted iff it
        lists ``rl_insight``) -> ``rl_insight_enable``, ``trainer.rl_insight`` ->
        ``rl_insight_config``, and the bridge's own section
        ``actor_rollout_ref.rollout.trace.otel_bridge`` (any keys of this class).
        Keyword overrides win over all of it; the environment fills the rest.

        Raises:
            ValueError: a key in the ``otel_bridge`` section is unknown, or a value is bad.
        """
        trainer = _section(verl_config, "trainer")
        values: dict[str, Any] = {}
        if trainer.get("project_name") is not None:
            values["project"] = trainer["project_name"]
        if trainer.get("experiment_name") is not None:
            values["experiment_name"] = trainer["experiment_name"]
        loggers = trainer.get("logger")
        if loggers is not None:
            names = [loggers] if isinstance(loggers, str) else list(loggers)
            values["rl_insight_enable"] = "rl_insight" in names
        if trainer.get("rl_insight") is not None:
            values["rl_insight_config"] = trainer["rl_insight"]
        trace = _section(_section(_section(verl_config, "actor_rollout_ref"), "rollout"), "trace")
        values.update(_section(trace, "otel_bridge"))
        values.update(overrides)
        return cls.resolve(values, environ=environ)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of every key (for logs, ``status()`` and ``doctor``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Settings that keep data private: when one cannot be read, nothing is exported at all.
PRIVACY_KEYS = ("redact_attributes",)


def key_named(error: BaseException | str) -> str | None:
    """The configuration key a ``ValueError`` from this module names, if any."""
    text, known = str(error), BridgeConfig.keys()
    return next((key for key in known if f": {key}=" in text or f"for {key!r}" in text), None)


def resolve_leniently(environ: Mapping[str, str] | None = None) -> tuple[BridgeConfig, list[str]]:
    """Resolve from the environment key by key, leaving out only the settings that cannot be used.

    For code that must not raise (a worker's first span): a variable that does not
    parse, or a value that conflicts with the others, is left out alone (its key
    keeps its default) and every other setting still applies. A privacy setting
    (``redact_attributes``) is never left out: if it cannot be read, or a variable
    that names no key looks like a misspelling of it, the returned config is
    disabled, so nothing is exported unredacted. Returns the config and one
    message per problem.
    """
    env = os.environ if environ is None else environ
    values, problems = _read_environment(env)
    messages = list(problems.values())
    meant = {_meant_key(name) for name in problems}
    for private in PRIVACY_KEYS:
        if private in meant:
            messages.append(
                f"verl_otel_bridge: {private} cannot be read, so nothing is exported rather than unredacted"
            )
            return BridgeConfig(enabled=False), messages
    known = BridgeConfig.keys()
    for _ in known:
        _fit_batch_to_queue(values)
        try:
            return BridgeConfig(**values), messages
        except ValueError as exc:
            key = key_named(exc)
            if key is None or key not in values:
                raise  # a conflict among defaults: a bug, not a setting
            messages.append(f"{exc} (set by {value_sources(environ=env)[key]})")
            del values[key]
    raise AssertionError("unreachable: each round leaves out one key")


def _meant_key(problem: str) -> str | None:
    """The key a problem is about: the key itself, or the closest key to an unknown variable's name."""
    if not problem.startswith(ENV_PREFIX):
        return problem
    close = difflib.get_close_matches(problem[len(ENV_PREFIX) :].lower(), BridgeConfig.keys(), n=1)
    return close[0] if close else None


def _fit_batch_to_queue(values: dict[str, Any]) -> None:
    if "max_export_batch_size" not in values and values.get("max_queue_size") is not None:
        # Only the queue was set (e.g. OTEL_BSP_MAX_QUEUE_SIZE=256): fit the default batch to it.
        values["max_export_batch_size"] = min(BridgeConfig.max_export_batch_size, values["max_queue_size"])


def value_sources(
    config: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> dict[str, str]:
    """Where each key's value comes from under :meth:`BridgeConfig.resolve`'s precedence.

    Returns ``{key: "default" | "environment VARIABLE" | "config" | "keyword"}``.
    """
    env = os.environ if environ is None else environ
    keys = BridgeConfig.keys()
    sources = dict.fromkeys(keys, "default")
    for key, aliases in _env_aliases().items():
        for alias in aliases:
            if env.get(alias, "").strip():
                sources[key] = f"environment {alias}"
    if sources["service_name"] == "default" and _resource_service_name(env):
        sources["service_name"] = "environment OTEL_RESOURCE_ATTRIBUTES"
    for key in keys:
        if f"{ENV_PREFIX}{key.upper()}" in env:
            sources[key] = f"environment {ENV_PREFIX}{key.upper()}"
    for key in config or {}:
        sources[str(key)] = "config"
    for key in overrides:
        sources[key] = "keyword"
    return sources


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """Config values found in ``environ`` (prefixed variables win over aliases).

    Raises:
        ValueError: a ``VERL_OTEL_BRIDGE_*`` variable that names no key, or a
            value that does not parse.
    """
    values, problems = _read_environment(environ)
    if problems:
        raise ValueError(next(iter(problems.values())))
    return values


def _read_environment(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each key's value from ``environ``, and a message for each key (or unknown variable) that failed."""
    keys = BridgeConfig.keys()
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for key, aliases in _env_aliases().items():
        for alias in aliases:
            raw = environ.get(alias)
            if raw is None or raw.strip() == "":
                continue
            try:
                value = _coerce(key, raw, alias)
            except ValueError as exc:
                problems[key] = str(exc)
                continue
            values[key] = (not value) if alias in _INVERTED_ALIASES else value
    if "service_name" not in values and (named := _resource_service_name(environ)):
        values["service_name"] = named  # as the SDK: OTEL_SERVICE_NAME first, then OTEL_RESOURCE_ATTRIBUTES
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in keys:
            problems[name] = _unknown_key_message(key, f"environment variable {name}")
            continue
        try:
            values[key] = _coerce(key, raw, name)
        except ValueError as exc:
            problems[key] = str(exc)
            values.pop(key, None)  # the alias's value must not stand in for the prefixed one
        else:
            problems.pop(key, None)  # the prefixed variable wins over a bad alias
    return values, problems


def _resource_service_name(environ: Mapping[str, str]) -> str | None:
    """``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` (``key=value,...``, percent-encoded), if set."""
    found = None
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == "service.name" and value.strip():
            found = unquote(value.strip())
    return found


def _section(mapping: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        return {}
    value = mapping.get(key)
    return value if isinstance(value, Mapping) else {}


def _coerce_all(mapping: Mapping[str, Any], source: str) -> dict[str, Any]:
    keys = BridgeConfig.keys()
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in keys:
            raise ValueError(_unknown_key_message(str(key), f"{source} key {key!r}"))
        out[key] = _coerce(key, value, f"{source} key {key!r}")
    return out


def _unknown_key_message(key: str, where: str) -> str:
    keys = BridgeConfig.keys()
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"verl_otel_bridge: unknown {where}.{hint} Known keys: {', '.join(keys)}."


_FIELD_TYPES: dict[str, str] = {
    "enabled": "bool",
    "handle_sigterm": "bool",
    "rl_insight_enable": "optional_bool",
    "memory_max_spans": "int",
    "max_queue_size": "optional_int",
    "max_queue_bytes": "int",
    "max_attribute_items": "int",
    "spill_max_bytes": "int",
    "spill_after_s": "float",
    "spill_probe_s": "float",
    "session_sample_rate": "float",
    "session_keep_slowest": "float",
    "session_keep_reward_extremes": "float",
    "session_hold_max_bytes": "int",
    "max_export_batch_size": "int",
    "schedule_delay_ms": "int",
    "shutdown_timeout_s": "float",
    "max_attribute_length": "int",
    "reminder_interval_s": "float",
    "progress_interval_s": "float",
    "straggler_factor": "float",
    "redact_attributes": "str_tuple",
    "rl_insight_config": "mapping",
    "project": "optional_str",
    "experiment_name": "optional_str",
    "rl_insight_server_url": "optional_str",
    "otlp_endpoint": "optional_str",
    "spill_dir": "optional_str",
    "exporter": "exporter",
}


def _coerce(key: str, value: Any, where: str) -> Any:
    """Turn a value from a mapping or the environment into the key's type."""
    kind = _FIELD_TYPES.get(key, "str")
    try:
        if kind in ("bool", "optional_bool"):
            return _to_bool(value, optional=kind == "optional_bool")
        if kind == "optional_int" and (value is None or (isinstance(value, str) and not value.strip())):
            return None
        if kind in ("int", "optional_int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind == "mapping":
            return _to_mapping(value)
        if kind == "str_tuple":
            return _to_str_tuple(value)
        if kind == "exporter":
            if isinstance(value, (set, frozenset)):
                raise TypeError  # unordered: which one is the primary?
            names = _to_str_tuple(value)
            if not names:
                raise ValueError
            return names[0] if len(names) == 1 else names
        if kind == "optional_str":
            return None if value is None else str(value)
        if not isinstance(value, str):
            raise TypeError
        return value.strip()
    except (TypeError, ValueError):
        expected = {
            "bool": "true or false",
            "optional_bool": "true, false or unset",
            "int": "an integer",
            "optional_int": "an integer or unset",
            "float": "a number",
            "mapping": "a mapping (or a JSON object in the environment)",
            "str_tuple": "a list of strings (comma-separated in the environment)",
            "exporter": f"one of {', '.join(EXPORTERS)}, or an ordered list of them (the first is the primary)",
            "str": "a string",
        }[kind.replace("optional_str", "str")]
        # Text that does not parse as a mapping may hold credentials in any shape: never echo it.
        shown = f"<{len(value)} characters, not shown>" if kind == "mapping" and isinstance(value, str) else value
        raise ValueError(
            f"verl_otel_bridge: {where} = {masked(key, shown)!r} is not valid for {key!r}: expected {expected}."
        ) from None


def _to_bool(value: Any, *, optional: bool) -> bool | None:
    if value is None and optional:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise ValueError


def _to_str_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError


def _to_mapping(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise TypeError
    return {str(k): (_to_mapping(v) if isinstance(v, Mapping) else v) for k, v in value.items()}


def _validate(config: BridgeConfig) -> None:
    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"verl_otel_bridge: {key}={getattr(config, key)!r} {why}")

    names = config.exporters
    for name in names:
        if name not in EXPORTERS:
            raise bad("exporter", f"names {name!r}, which is not one of: {', '.join(EXPORTERS)}.")
    if len(set(names)) != len(names):
        raise bad("exporter", "lists an exporter twice.")
    if len(names) > 1 and ("none" in names or any(n in ("auto", "rl_insight") for n in names[1:])):
        raise bad("exporter", "can list 'auto' or 'rl_insight' only first, and 'none' only alone.")
    if config.fallback not in FALLBACKS:
        raise bad("fallback", f"is not one of: {', '.join(FALLBACKS)}.")
    if config.rl_insight_transport not in TRANSPORTS:
        raise bad("rl_insight_transport", f"is not one of: {', '.join(TRANSPORTS)}.")
    if config.max_queue_size is not None and config.max_queue_size < 1:
        raise bad("max_queue_size", "must be at least 1 (or unset: bounded by max_queue_bytes only).")
    for key in (
        "memory_max_spans",
        "max_export_batch_size",
        "max_attribute_length",
        "max_attribute_items",
        "max_queue_bytes",
        "session_hold_max_bytes",
    ):
        if getattr(config, key) < 1:
            raise bad(key, "must be at least 1.")
    if config.max_queue_size is not None and config.max_export_batch_size > config.max_queue_size:
        raise bad("max_export_batch_size", f"must not exceed max_queue_size ({config.max_queue_size}).")
    if config.spill_max_bytes < 0:
        raise bad("spill_max_bytes", "must not be negative (0 turns spilling off).")
    if config.spill_dir == "":
        raise bad("spill_dir", "must name a directory (or be unset: the default).")
    for key in ("session_sample_rate", "session_keep_slowest", "session_keep_reward_extremes"):
        if not 0 <= getattr(config, key) <= 1:
            raise bad(key, "must be a fraction from 0 to 1.")
    if config.schedule_delay_ms < 0:
        raise bad("schedule_delay_ms", "must not be negative.")
    if config.schedule_delay_ms > MAX_WAIT_S * 1000:
        raise bad("schedule_delay_ms", f"must be at most {MAX_WAIT_S * 1000} (an hour).")
    for key in ("reminder_interval_s", "shutdown_timeout_s", "spill_after_s", "spill_probe_s"):
        value = getattr(config, key)
        if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
            raise bad(key, f"must be a positive, finite number of seconds, at most {MAX_WAIT_S} (an hour).")
    if not (math.isfinite(config.progress_interval_s) and 0 <= config.progress_interval_s <= MAX_WAIT_S):
        raise bad("progress_interval_s", f"must be 0 (off) or a positive number of seconds, at most {MAX_WAIT_S}.")
    if not (math.isfinite(config.straggler_factor) and config.straggler_factor >= 0):
        raise bad("straggler_factor", "must be 0 (off) or a positive, finite number.")
    if not config.jsonl_path:
        raise bad("jsonl_path", "must name a file.")
    try:
        Version(config.rl_insight_min_version)
    except InvalidVersion:
        raise bad("rl_insight_min_version", "is not a version such as '0.3.0'.") from None
