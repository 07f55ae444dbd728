"""The one table of exporter kinds a config can name (all but ``auto``/``rl_insight``, which the route decides).

Each :class:`ExporterKind` says how the exporter is built from a config, how
``doctor`` checks it, whether it runs inline (no I/O, so no export queue), and
whether it sends over the network.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from verl_otel_bridge._internal.captures.doctor import check_capture_dir
from verl_otel_bridge._internal.config import BridgeConfig, ConfigError
from verl_otel_bridge._internal.exporters.console import console_exporter
from verl_otel_bridge._internal.exporters.discard import DiscardSpanExporter
from verl_otel_bridge._internal.exporters.jsonl import jsonl_exporter
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.exporters.vocabulary import GenericVocabularySpanExporter

#: ``doctor``'s check of one exporter: ``{"exporter", "ok", "detail"}``, and ``"fix"`` when it has one.
Check = dict[str, Any]


@dataclass(frozen=True)
class ExporterKind:
    """One exporter name: how it is built, how ``doctor`` checks it, whether it runs inline, whether it
    sends over the network (then the end of a unit of work does not wait for it: see ``Bridge.flush_queued``).

    ``check(config, environ, timeout_s)`` says what the exporter would do with spans and
    whether the bridge could build it, without building it (``otlp`` asks its endpoint).
    """

    name: str
    build: Callable[[BridgeConfig], SpanExporter]
    check: Callable[[BridgeConfig, Mapping[str, str], float], Check]
    inline: bool = False
    network: bool = False


def _said(detail: Callable[[BridgeConfig], str]) -> Callable[[BridgeConfig, Mapping[str, str], float], Check]:
    return lambda config, environ, timeout_s: {"ok": True, "detail": detail(config)}


def _check_jsonl(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> Check:
    if config.capture_dir is not None:
        return check_capture_dir(config)
    path = Path(config.jsonl_path).absolute()  # as the jsonl exporter opens it (no ~ expansion)
    if path.exists():
        writable = path.is_file() and os.access(path, os.W_OK)
    else:  # the exporter creates the missing directories: the nearest existing one must take them
        nearest = next((p for p in path.parents if p.exists()), Path("/"))
        writable = nearest.is_dir() and os.access(nearest, os.W_OK | os.X_OK)
    return {"ok": writable, "detail": f"appended to {path}" if writable else f"{path} cannot be written"}


def _check_otlp(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> Check:
    from verl_otel_bridge._internal.otlp.check import check_otlp_endpoint
    from verl_otel_bridge._internal.otlp.sender import import_urllib3
    from verl_otel_bridge._internal.otlp.settings import SenderSettings, check_protocol, traces_endpoint

    try:
        check_protocol(environ)
        endpoint, _ = traces_endpoint(environ, config.otlp_endpoint, "otlp_endpoint")
        SenderSettings.from_environment(environ)
        import_urllib3("exporter 'otlp'")
    except ValueError as exc:
        return {"ok": False, "detail": str(exc)}
    answer = check_otlp_endpoint(endpoint, environ, timeout_s)
    return {
        "ok": answer["ok"],
        "detail": f"OTLP/HTTP to {answer['endpoint']}: {answer['answer']}",
        "fix": answer["fix"],
    }


def otlp_exporter(config: BridgeConfig) -> SpanExporter:
    """The package's OTLP/HTTP exporter, configured as OpenTelemetry's would be (``OTEL_EXPORTER_OTLP_*``).

    ``otlp_endpoint``, when set, is the traces URL as it is.

    Raises:
        ValueError: a bad ``OTEL_EXPORTER_OTLP_*`` value, or urllib3 (the ``otlp`` extra) is missing.
    """
    from verl_otel_bridge._internal.otlp.exporter import OtlpSpanExporter
    from verl_otel_bridge._internal.otlp.sender import import_urllib3

    import_urllib3("exporter 'otlp'")
    return OtlpSpanExporter.from_environment(endpoint=config.otlp_endpoint)


#: ``otlp`` sends the generic vocabulary (OpenInference and GenAI keys, see
#: :mod:`verl_otel_bridge._internal.exporters.vocabulary`); ``memory``, ``jsonl`` and ``console``
#: keep the spans as recorded (the bridge's record format, which ``show`` and ``replay``
#: read), so a capture replays losslessly anywhere.
KINDS: dict[str, ExporterKind] = {
    kind.name: kind
    for kind in (
        ExporterKind(
            "memory",
            lambda config: BoundedMemorySpanExporter(config.memory_max_spans),
            _said(lambda config: f"kept in this process only (the newest {config.memory_max_spans})"),
            inline=True,
        ),
        ExporterKind("jsonl", jsonl_exporter, _check_jsonl),
        ExporterKind(
            "console",
            lambda config: console_exporter(format=config.console_format),
            _said(
                lambda config: (
                    "one JSON line per span on standard output"
                    if config.console_format == "json"
                    else "readable lines on standard output, a session's spans together when it ends"
                )
            ),
        ),
        ExporterKind(
            "otlp",
            lambda config: GenericVocabularySpanExporter(otlp_exporter(config), config.project),
            _check_otlp,
            network=True,
        ),
        ExporterKind("none", lambda config: DiscardSpanExporter(), _said(lambda config: "discarded"), inline=True),
    )
}


def kind(name: str) -> ExporterKind:
    """The kind named ``name``.

    Raises:
        ConfigError: no exporter kind has that name.
    """
    if name not in KINDS:
        raise ConfigError(f"verl_otel_bridge: {name!r} is not an exporter name ({', '.join(KINDS)})", "exporter")
    return KINDS[name]


def named_exporter(name: str, config: BridgeConfig) -> SpanExporter:
    """The exporter ``name`` set up from ``config``.

    Raises:
        ValueError: an unknown name, an unusable setting (e.g. ``jsonl_path``), or ``otlp``
            without its optional dependency.
    """
    return kind(name).build(config)


def check_exporter(name: str, config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> Check:
    """``doctor``'s check of exporter ``name``: ``{"exporter", "ok", "detail"}`` (and ``"fix"`` when it has one)."""
    return {"exporter": name, **kind(name).check(config, environ, timeout_s)}


def network(names: tuple[str, ...]) -> bool:
    """Whether any of ``names`` sends over the network."""
    return any(kind(name).network for name in names)


def inline(names: tuple[str, ...]) -> bool:
    """Whether every one of ``names`` runs inline (no I/O), so spans need no export queue."""
    return all(kind(name).inline for name in names)
