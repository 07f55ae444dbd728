"""Bridge configuration: one frozen object, resolved once, validated early.

Each setting is declared once, as a field of :class:`BridgeConfig` whose
:class:`Setting` (``dataclasses.fields(BridgeConfig)[i].metadata["setting"]``,
or :func:`settings`) holds its kind, its check, the environment variables it
reads and one line of doc; conversion, validation and the environment are
handled from that declaration alone.

Precedence, highest first: keyword overrides, the mapping passed to
``configure()``, environment variables, defaults. Every key can be set from the
environment as ``VERL_OTEL_BRIDGE_<KEY>``; a few keys also read the variables
their ecosystem already uses (verl's ``VERL_RL_INSIGHT_ENABLE``, RL-Insight's
``RL_INSIGHT_SERVER_URL``, OpenTelemetry's ``OTEL_*``). The prefixed variable
wins over those aliases.

Mistakes raise :class:`ConfigError` (a :class:`ValueError`) naming the key, the
value and the fix, so a training job fails at start-up instead of running
unobserved.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

from packaging.version import InvalidVersion, Version

from verl_otel_bridge._internal.exporter_names import LOCAL_NAMES, NAMES, OTEL_NAMES, TRACES_EXPORTER_ENV, from_otel
from verl_otel_bridge._internal.secrets import masked

ENV_PREFIX = "VERL_OTEL_BRIDGE_"
#: verl's switch for RL-Insight: it sets ``1`` when ``trainer.logger`` lists ``rl_insight``.
RL_INSIGHT_ENABLE_ENV = "VERL_RL_INSIGHT_ENABLE"
#: RL-Insight's own variable for its server.
RL_INSIGHT_SERVER_URL_ENV = "RL_INSIGHT_SERVER_URL"

#: Where spans can go (:mod:`verl_otel_bridge._internal.exporter_names`).
#: ``auto``: RL-Insight when usable, else ``fallback``.
EXPORTERS = tuple(NAMES)
#: Where spans go when RL-Insight is wanted but not usable.
FALLBACKS = LOCAL_NAMES
#: How spans reach RL-Insight's trace store.
TRANSPORTS = ("auto", "hub", "otlp")
#: OTLP request body compressions.
COMPRESSIONS = ("none", "gzip", "deflate")
#: The only OTLP wire protocol the bridge speaks.
OTLP_PROTOCOL = "http/protobuf"
#: Appended to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL); never to the ``TRACES`` one.
OTLP_TRACES_PATH = "v1/traces"

#: The longest any wait setting may be: beyond it a thread's wait overflows, and no
#: training job wants an exporter to wait longer.
MAX_WAIT_S = 3600

# RFC 9110 field-name token.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A setting that cannot be used; ``key`` is the configuration key it is about (None: no key, e.g. unknown)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class Unfit(ValueError):
    """Raised by a :class:`Kind`'s converter with a reason safe to show (it never quotes the value)."""


def default_spill_dir() -> str:
    """Where spill files go unless ``spill_dir`` says otherwise: ``<tmp>/verl_otel_bridge_spill-<uid>`` (per user)."""
    return os.path.join(tempfile.gettempdir(), f"verl_otel_bridge_spill-{os.geteuid()}")


# -- kinds: how a value from a mapping or the environment becomes the key's type ------------


@dataclass(frozen=True)
class Kind:
    """A setting's type: ``convert`` raises TypeError or ValueError on a value it cannot take."""

    expected: str
    convert: Callable[[Any], Any]
    #: False where text that does not parse may hold credentials in any shape (never echoed).
    echoes_text: bool = True


def parse_bool(value: Any) -> bool:
    """The one rule for on/off values: ``True``/``1``/``true``/``yes``/``on`` and their opposites (any case).

    Raises:
        ValueError: anything else.
    """
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


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise TypeError
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    return float(value)


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value.strip()


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


def _to_exporter(value: Any) -> str | tuple[str, ...]:
    if isinstance(value, (set, frozenset)):
        raise TypeError  # unordered: which one is the primary?
    names = _to_str_tuple(value)
    if not names:
        raise ValueError
    return names[0] if len(names) == 1 else names


def _to_headers(value: Any) -> dict[str, str]:
    """``name1=value1,name2=value2`` (URL-encoded, as OpenTelemetry spells headers) or a mapping; names lowercased."""
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v), True) for k, v in value.items()]
    elif isinstance(value, str):
        pairs = [
            (unquote(n), unquote(t), bool(sep))
            for n, sep, t in (e.partition("=") for e in value.split(",") if e.strip())
        ]
    else:
        raise TypeError
    headers: dict[str, str] = {}
    for position, (name, text, paired) in enumerate(pairs, 1):
        name, text = name.strip().lower(), text.strip()
        problem = (
            "is not name=value"
            if not paired or not name
            else "has a name that is not a valid header name"
            if not _HEADER_NAME.fullmatch(name)
            else "has a line break in its value"
            if "\r" in text or "\n" in text
            else None
        )
        if problem is not None:
            raise Unfit(f"entry {position} of {len(pairs)} {problem}; values are not shown: they may be secrets")
        headers[name] = text
    return headers


def _or_none(convert: Callable[[Any], Any], *, blank: bool = False) -> Callable[[Any], Any]:
    """``convert``, with None (and, if ``blank``, blank text) meaning unset."""

    def optional(value: Any) -> Any:
        if value is None or (blank and isinstance(value, str) and not value.strip()):
            return None
        return convert(value)

    return optional


BOOL = Kind("true or false", parse_bool)
OPTIONAL_BOOL = Kind("true, false or unset", _or_none(parse_bool))
INT = Kind("an integer", _to_int)
OPTIONAL_INT = Kind("an integer or unset", _or_none(_to_int, blank=True))
FLOAT = Kind("a number", _to_float)
STR = Kind("a string", _to_str)
OPTIONAL_STR = Kind("a string", _or_none(str))
STR_TUPLE = Kind("a list of strings (comma-separated in the environment)", _to_str_tuple)
MAPPING = Kind("a mapping (or a JSON object in the environment)", _to_mapping, echoes_text=False)
EXPORTER = Kind(f"one of {', '.join(EXPORTERS)}, or an ordered list of them (the first is the primary)", _to_exporter)
SECONDS = Kind(
    "a number of seconds (read in seconds, as OpenTelemetry Python reads it), or unset", _or_none(_to_float, blank=True)
)
LOWER_STR = Kind("a string", lambda value: _to_str(value).lower())
HEADERS = Kind(
    "name=value pairs separated by commas, with ',' and '=' in values URL-encoded (%2C, %3D), or a mapping",
    _or_none(_to_headers, blank=True),
    echoes_text=False,
)


# -- checks: what a converted value must be (None: fine, else why not) ----------------------

Check = Callable[[Any], str | None]


def did_you_mean(word: str, known: tuple[str, ...]) -> str:
    """`` Did you mean 'x'?`` for the known word closest to ``word`` (case aside), else ``""``: the one hint
    for unknown keys and for values outside a key's choices."""
    close = difflib.get_close_matches(word.lower(), known, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _not_one_of(value: str, choices: tuple[str, ...]) -> str:
    return f"is not one of: {', '.join(choices)}.{did_you_mean(value, choices)}"


def _one_of(choices: tuple[str, ...]) -> Check:
    return lambda value: None if value in choices else _not_one_of(value, choices)


def _at_least_1(value: int) -> str | None:
    return None if value >= 1 else "must be at least 1."


def _fraction(value: float) -> str | None:
    return None if 0 <= value <= 1 else "must be a fraction from 0 to 1."


def _wait_s(value: float) -> str | None:
    if math.isfinite(value) and 0 < value <= MAX_WAIT_S:
        return None
    return f"must be a positive, finite number of seconds, at most {MAX_WAIT_S} (an hour)."


def _exporter_names(value: str | tuple[str, ...]) -> str | None:
    names = (value,) if isinstance(value, str) else value
    for name in names:
        if name not in EXPORTERS:
            return f"names {name!r}, which {_not_one_of(name, EXPORTERS)}"
    if len(set(names)) != len(names):
        return "lists an exporter twice."
    if len(names) > 1 and ("none" in names or any(n in ("auto", "rl_insight") for n in names[1:])):
        return "can list 'auto' or 'rl_insight' only first, and 'none' only alone."
    return None


def http_url_problem(value: str | None) -> str | None:
    """Why ``value`` is not an ``http(s)`` URL with a host (None: it is, or it is unset); never quotes it."""
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme in ("http", "https") and parsed.hostname:
        return None
    return "is not an http(s) URL with a host; write it as http://HOST:4318/v1/traces (or https://...)."


def _queue_size(value: int | None) -> str | None:
    if value is None or value >= 1:
        return None
    return "must be at least 1 (or unset: bounded by max_queue_bytes only)."


def _schedule_delay(value: int) -> str | None:
    if value < 0:
        return "must not be negative."
    return None if value <= MAX_WAIT_S * 1000 else f"must be at most {MAX_WAIT_S * 1000} (an hour)."


def _version(value: str) -> str | None:
    try:
        Version(value)
    except InvalidVersion:
        return "is not a version such as '0.3.0'."
    return None


# -- declaration ---------------------------------------------------------------------------


class Alias(NamedTuple):
    """An environment variable besides ``VERL_OTEL_BRIDGE_<KEY>`` that sets a key.

    ``inverted``: a true value means the key is false. ``extract``: the key's raw
    value within the variable's text (None: the variable does not set it). ``hint``:
    said after an error about a value this variable set.
    """

    name: str
    inverted: bool = False
    extract: Callable[[str], str | None] | None = None
    hint: str = ""


@dataclass(frozen=True)
class Setting:
    """One configuration key's declaration: its kind, its check, its aliases and one line of doc."""

    kind: Kind
    doc: str
    aliases: tuple[Alias, ...] = ()
    check: Check | None = None


def _resource_service_name(text: str) -> str | None:
    """``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` text (``key=value,...``, percent-encoded), if set."""
    found = None
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == "service.name" and value.strip():
            found = unquote(value.strip())
    return found


def _traces_url(base: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL) as the traces URL: with ``/v1/traces`` appended."""
    return f"{base.strip().removesuffix('/')}/{OTLP_TRACES_PATH}" if base.strip() else None


def _otlp_variables(name: str) -> tuple[str, str]:
    """OpenTelemetry's two variables for an OTLP setting: the traces one wins over the general one."""
    return f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"


def _setting(
    default: Any,
    kind: Kind,
    doc: str,
    *,
    env: tuple[str | Alias, ...] = (),
    check: Check | None = None,
    hash: bool = True,
) -> Any:
    aliases = tuple(alias if isinstance(alias, Alias) else Alias(alias) for alias in env)
    return field(default=default, hash=hash, metadata={"setting": Setting(kind, doc, aliases, check)})


@dataclass(frozen=True)
class BridgeConfig:
    """Everything the bridge can be told. Build it with :meth:`resolve`.

    Each key's doc, kind, range and environment variables are its :class:`Setting`
    (:func:`settings`); ``docs/configuration.md`` explains each one at length.
    """

    enabled: bool = _setting(
        True, BOOL, "False turns every span API into a cheap no-op.", env=(Alias("OTEL_SDK_DISABLED", inverted=True),)
    )
    exporter: str | tuple[str, ...] = _setting(
        "auto",
        EXPORTER,
        "Where spans go; a list: the first is the primary, the others get copies.",
        env=(
            Alias(
                TRACES_EXPORTER_ENV,
                extract=from_otel,
                hint=f"VERL_OTEL_BRIDGE_EXPORTER wins over {TRACES_EXPORTER_ENV}, of whose values the bridge "
                f"reads {', '.join(OTEL_NAMES)}.",
            ),
        ),
        check=_exporter_names,
    )
    fallback: str = _setting(
        "memory", STR, "Where spans go when RL-Insight is wanted but unusable.", check=_one_of(FALLBACKS)
    )
    jsonl_path: str = _setting(
        "verl_otel_spans.jsonl",
        STR,
        "File the jsonl exporter appends to.",
        check=lambda value: None if value else "must name a file.",
    )
    # -- the capture layout of exporter jsonl (docs/protocol.md#capture-directories) --
    capture_dir: str | None = _setting(
        None,
        OPTIONAL_STR,
        "Directory of run folders the jsonl exporter writes (unset: the one file jsonl_path).",
        check=lambda value: "must name a directory (or be unset: the file jsonl_path)." if value == "" else None,
    )
    capture_run: str | None = _setting(
        None, OPTIONAL_STR, "The run folder's name in capture_dir (unset: derived, the same in every process of a run)."
    )
    capture_rotate_bytes: int = _setting(
        64 * 1024 * 1024, INT, "A capture file is closed and the next one begun past this size.", check=_at_least_1
    )
    capture_max_bytes: int | None = _setting(
        None,
        OPTIONAL_INT,
        "A run folder's disk budget: past it its oldest steps go (unset: a quarter of the free space; 0: none).",
        check=lambda value: "must not be negative (0: no budget)." if value is not None and value < 0 else None,
    )
    otlp_endpoint: str | None = _setting(
        None,
        OPTIONAL_STR,
        "Traces URL of the otlp exporter (unset: http://localhost:4318/v1/traces).",
        env=("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Alias("OTEL_EXPORTER_OTLP_ENDPOINT", extract=_traces_url)),
        check=http_url_problem,
    )
    otlp_headers: Mapping[str, str] | None = _setting(
        None,
        HEADERS,
        "Extra OTLP/HTTP request headers (values never shown).",
        env=_otlp_variables("HEADERS"),
        hash=False,
    )
    otlp_timeout_s: float | None = _setting(
        None,
        SECONDS,
        "Bound of one OTLP export, retries included (unset: 10 s; 5 s to RL-Insight's endpoint).",
        env=_otlp_variables("TIMEOUT"),
        check=lambda value: None if value is None else _wait_s(value),
    )
    otlp_compression: str = _setting(
        "none",
        LOWER_STR,
        "OTLP request compression: none, gzip or deflate.",
        env=_otlp_variables("COMPRESSION"),
        check=_one_of(COMPRESSIONS),
    )
    otlp_certificate: str | None = _setting(
        None,
        OPTIONAL_STR,
        "CA bundle (PEM) trusted for https OTLP endpoints (unset: the system's).",
        env=_otlp_variables("CERTIFICATE"),
    )
    otlp_client_certificate: str | None = _setting(
        None,
        OPTIONAL_STR,
        "Client certificate (PEM) for mutual TLS to OTLP endpoints.",
        env=_otlp_variables("CLIENT_CERTIFICATE"),
    )
    otlp_client_key: str | None = _setting(
        None,
        OPTIONAL_STR,
        "Its private key (unset: inside otlp_client_certificate).",
        env=_otlp_variables("CLIENT_KEY"),
    )
    otlp_protocol: str = _setting(
        OTLP_PROTOCOL,
        LOWER_STR,
        f"The OTLP wire protocol; the bridge sends {OTLP_PROTOCOL} only.",
        env=_otlp_variables("PROTOCOL"),
    )
    memory_max_spans: int = _setting(
        10_000, INT, "The in-memory exporter keeps this many of the newest spans.", check=_at_least_1
    )
    project: str | None = _setting(None, OPTIONAL_STR, "RL-Insight project and the identity's default project.")
    experiment_name: str | None = _setting(
        None, OPTIONAL_STR, "RL-Insight experiment and the identity's default experiment_name."
    )
    service_name: str = _setting(
        "verl_otel_bridge",
        STR,
        "OpenTelemetry service.name of the bridge's resource.",
        env=("OTEL_SERVICE_NAME", Alias("OTEL_RESOURCE_ATTRIBUTES", extract=_resource_service_name)),
    )
    rl_insight_enable: bool | None = _setting(
        None,
        OPTIONAL_BOOL,
        "True: RL-Insight wanted; False: auto stays local; unset: auto probes.",
        env=(RL_INSIGHT_ENABLE_ENV,),
    )
    rl_insight_server_url: str | None = _setting(
        None, OPTIONAL_STR, "RL-Insight server URL.", env=(RL_INSIGHT_SERVER_URL_ENV,)
    )
    rl_insight_min_version: str = _setting(
        "0.3.0", STR, "The oldest RL-Insight the bridge forwards to.", check=_version
    )
    rl_insight_config: Mapping[str, Any] | None = _setting(
        None, MAPPING, "Passed as config= to rl_insight.init.", hash=False
    )
    rl_insight_transport: str = _setting(
        "auto", STR, "How spans reach RL-Insight's trace store: hub, otlp or auto.", check=_one_of(TRANSPORTS)
    )
    max_queue_size: int | None = _setting(
        None,
        OPTIONAL_INT,
        "At most this many spans wait in memory for export (unset: bytes only).",
        env=("OTEL_BSP_MAX_QUEUE_SIZE",),
        check=_queue_size,
    )
    max_queue_bytes: int = _setting(
        256 * 1024 * 1024, INT, "Estimated bytes of spans waiting in memory for export.", check=_at_least_1
    )
    max_export_batch_size: int = _setting(
        512, INT, "Spans handed to the exporter at once.", env=("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), check=_at_least_1
    )
    schedule_delay_ms: int = _setting(
        1000,
        INT,
        "Longest wait before queued spans are exported.",
        env=("OTEL_BSP_SCHEDULE_DELAY",),
        check=_schedule_delay,
    )
    shutdown_timeout_s: float = _setting(10.0, FLOAT, "Longest shutdown() waits for pending exports.", check=_wait_s)
    max_attribute_length: int = _setting(
        32_768, INT, "Longer string attribute values are truncated, with a marker.", check=_at_least_1
    )
    max_attribute_items: int = _setting(
        32_768, INT, "Longer sequence attribute values keep their first this many items.", check=_at_least_1
    )
    spill_dir: str | None = _setting(
        None,
        OPTIONAL_STR,
        "Directory of the spill files (unset: default_spill_dir()).",
        check=lambda value: "must name a directory (or be unset: the default)." if value == "" else None,
    )
    spill_max_bytes: int = _setting(
        1024 * 1024 * 1024,
        INT,
        "The spill files' total size at most; 0 turns spilling off.",
        check=lambda value: "must not be negative (0 turns spilling off)." if value < 0 else None,
    )
    spill_after_s: float = _setting(
        60.0, FLOAT, "After this long of refused batches, batches go straight to the spill.", check=_wait_s
    )
    spill_probe_s: float = _setting(
        5.0, FLOAT, "While the destination is down, how often a batch is tried.", check=_wait_s
    )
    session_sample_rate: float = _setting(1.0, FLOAT, "The fraction of session groups (by uid) kept.", check=_fraction)
    session_keep_slowest: float = _setting(
        0.0, FLOAT, "Also keep a session among its step's slowest this fraction (0: off).", check=_fraction
    )
    session_keep_reward_extremes: float = _setting(
        0.0, FLOAT, "Also keep a session among its step's reward extremes this fraction (0: off).", check=_fraction
    )
    session_hold_max_bytes: int = _setting(
        64 * 1024 * 1024, INT, "Estimated bytes of spans held for sampling at most.", check=_at_least_1
    )
    record_text: bool = _setting(
        False, BOOL, "The verl plugin records the conversation even when verl's trace.token2text is off."
    )
    redact_attributes: tuple[str, ...] = _setting(
        (), STR_TUPLE, "Attribute keys whose values become [REDACTED] before any exporter sees them."
    )
    reminder_interval_s: float = _setting(
        600.0, FLOAT, "While RL-Insight stays unusable, a reminder is logged this often.", check=_wait_s
    )
    handle_sigterm: bool = _setting(True, BOOL, "On SIGTERM, flush queued spans before the process stops.")
    progress_interval_s: float = _setting(
        60.0,
        FLOAT,
        "A session open longer than this exports an agent_session.progress span this often (0: off).",
        check=lambda value: (
            None
            if math.isfinite(value) and 0 <= value <= MAX_WAIT_S
            else f"must be 0 (off) or a positive number of seconds, at most {MAX_WAIT_S}."
        ),
    )
    straggler_factor: float = _setting(
        3.0,
        FLOAT,
        "Log sessions open longer than this many times their step's median (0: off).",
        check=lambda value: (
            None if math.isfinite(value) and value >= 0 else "must be 0 (off) or a positive, finite number."
        ),
    )

    console_format: str = _setting(
        "text",
        STR,
        "How the console exporter prints spans: text (readable lines, a session's spans together) or json (records).",
        check=_one_of(("text", "json")),
    )

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
        return tuple(settings())

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
            ConfigError: an unknown key, or a value of the wrong type or range.
        """
        if isinstance(config, BridgeConfig):
            return dataclasses.replace(config, **_coerce_all(overrides, "keyword")) if overrides else config
        env = os.environ if environ is None else environ
        values, problems = _read_environment(env)
        if problems:  # the first variable that names no key or does not parse
            key = next(iter(problems))
            raise ConfigError(problems[key], key if key in _SETTINGS else None)
        if config is not None:
            if not isinstance(config, Mapping):
                raise ConfigError(f"configure() takes a mapping or a BridgeConfig, not {type(config).__name__}")
            values.update(_coerce_all(config, "config"))
        values.update(_coerce_all(overrides, "keyword"))
        _fit_batch_to_queue(values)
        sources = value_sources(config, environ=env, **overrides)
        try:
            resolved = cls(**values)
        except ConfigError as exc:
            if exc.key is None or sources[exc.key] == "default":
                raise
            raise ConfigError(_with_source(str(exc), exc.key, sources[exc.key]), exc.key) from None
        object.__setattr__(resolved, "_sources", sources)
        return resolved

    def error(self, key: str, message: str) -> ConfigError:
        """A :class:`ConfigError` about ``key`` found after resolving (e.g. a file that cannot be loaded):
        ``message``, and where the value came from when :meth:`resolve` knows."""
        source = getattr(self, "_sources", {}).get(key, "default")
        return ConfigError(_with_source(message, key, source) if source != "default" else message, key)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of every key (for logs, ``status()`` and ``doctor``)."""
        return {key: getattr(self, key) for key in _SETTINGS}


def settings() -> dict[str, Setting]:
    """Every key's :class:`Setting`, in declaration order."""
    return _SETTINGS


_SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(BridgeConfig)}

#: Settings that keep data private: when one cannot be read, nothing is exported at all.
PRIVACY_KEYS = ("redact_attributes",)


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
    for _ in _SETTINGS:
        _fit_batch_to_queue(values)
        try:
            return BridgeConfig(**values), messages
        except ConfigError as exc:
            if exc.key is None or exc.key not in values:
                raise  # a conflict among defaults: a bug, not a setting
            messages.append(_with_source(str(exc), exc.key, value_sources(environ=env)[exc.key]))
            del values[exc.key]
    raise AssertionError("unreachable: each round leaves out one key")


def _environment_source(name: str) -> str:
    """How :func:`value_sources` names variable ``name`` as a source."""
    return f"environment {name}"


def _with_source(message: str, key: str, source: str) -> str:
    """An error ``message`` about ``key`` with where its value came from, and the hint of the alias that set it."""
    hints = [alias.hint for alias in _SETTINGS[key].aliases if alias.hint and source == _environment_source(alias.name)]
    return " ".join([f"{message} (set by {source})", *hints])


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
    sources = dict.fromkeys(_SETTINGS, "default")
    for key in _SETTINGS:
        for name, _raw in _variables_set(key, env):
            sources[key] = _environment_source(name)
            break
    for key in config or {}:
        sources[str(key)] = "config"
    for key in overrides:
        sources[key] = "keyword"
    return sources


def environment_variables(key: str) -> tuple[str, ...]:
    """The variables that set ``key``, the one that wins first: ``VERL_OTEL_BRIDGE_<KEY>``, then its aliases."""
    return (f"{ENV_PREFIX}{key.upper()}", *(alias.name for alias in _SETTINGS[key].aliases))


def _variables_set(key: str, environ: Mapping[str, str]) -> list[tuple[str, Any]]:
    """``(variable, raw value)`` of each variable in ``environ`` that sets ``key``, the winner first.

    The prefixed variable counts whenever it is present; an alias only when it is not blank.
    """
    found: list[tuple[str, Any]] = []
    prefixed = f"{ENV_PREFIX}{key.upper()}"
    if prefixed in environ:
        found.append((prefixed, environ[prefixed]))
    for alias in _SETTINGS[key].aliases:
        raw: str | None = environ.get(alias.name)
        if raw is not None and alias.extract is not None:
            raw = alias.extract(raw)
        if raw is not None and raw.strip():
            found.append((alias.name, raw))
    return found


def environment_value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value a declared variable (prefixed or an alias) sets its key to, read by that key's rule.

    None when the variable is unset or blank.

    Raises:
        ConfigError: ``name`` is set but does not parse.
        KeyError: no key reads ``name``.
    """
    env = os.environ if environ is None else environ
    for key in _SETTINGS:
        if name in environment_variables(key):
            return next((_env_value(key, var, raw) for var, raw in _variables_set(key, env) if var == name), None)
    raise KeyError(name)


def _env_value(key: str, variable: str, raw: Any) -> Any:
    value = _coerce(key, raw, variable)
    inverted = any(alias.inverted for alias in _SETTINGS[key].aliases if alias.name == variable)
    return (not value) if inverted else value


def _read_environment(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each key's value from ``environ``, and a message for each key (or unknown variable) that failed.

    A key takes the first of its variables that is set, the prefixed one first, then its
    aliases in order; when that one does not parse, the key fails (the next does not stand in).
    """
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for key in _SETTINGS:
        for variable, raw in _variables_set(key, environ)[:1]:
            try:
                values[key] = _env_value(key, variable, raw)
            except ConfigError as exc:
                problems[key] = str(exc)
    for name in environ:
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :].lower() not in _SETTINGS:
            problems[name] = _unknown_key_message(name[len(ENV_PREFIX) :].lower(), f"environment variable {name}")
    return values, problems


def _coerce_all(mapping: Mapping[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in _SETTINGS:
            raise ConfigError(_unknown_key_message(str(key), f"{source} key {key!r}"))
        out[key] = _coerce(key, value, f"{source} key {key!r}")
    return out


def _unknown_key_message(key: str, where: str) -> str:
    keys = BridgeConfig.keys()
    return f"verl_otel_bridge: unknown {where}.{did_you_mean(key, keys)} Known keys: {', '.join(keys)}."


def _coerce(key: str, value: Any, where: str) -> Any:
    """Turn a value from a mapping or the environment into the key's type, by its :class:`Kind`."""
    kind = _SETTINGS[key].kind
    try:
        return kind.convert(value)
    except (TypeError, ValueError) as exc:
        shown = value if kind.echoes_text or not isinstance(value, str) else f"<{len(value)} characters, not shown>"
        why = f" ({exc})" if isinstance(exc, Unfit) else ""
        raise ConfigError(
            f"verl_otel_bridge: {where} = {masked(key, shown)!r} is not valid for {key!r}: expected "
            f"{kind.expected}{why}.",
            key,
        ) from None


def _validate(config: BridgeConfig) -> None:
    for key, setting in _SETTINGS.items():
        value = getattr(config, key)
        why = setting.check(value) if setting.check is not None else None
        if why is not None:
            raise ConfigError(f"verl_otel_bridge: {key}={masked(key, value)!r} {why}", key)
    if "otlp" in config.exporters and config.otlp_protocol != OTLP_PROTOCOL:
        raise ConfigError(
            f"verl_otel_bridge: otlp_protocol={config.otlp_protocol!r}, but the bridge's OTLP exporter sends "
            f"{OTLP_PROTOCOL} only; unset it (OTEL_EXPORTER_OTLP_PROTOCOL) or set {OTLP_PROTOCOL}, with the "
            "endpoint at the collector's OTLP/HTTP port (4318 by default).",
            "otlp_protocol",
        )
    if config.max_queue_size is not None and config.max_export_batch_size > config.max_queue_size:
        raise ConfigError(
            f"verl_otel_bridge: max_export_batch_size={config.max_export_batch_size!r} "
            f"must not exceed max_queue_size ({config.max_queue_size}).",
            "max_export_batch_size",
        )
