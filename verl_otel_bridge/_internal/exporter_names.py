"""The one table of exporter names: what each is, what it needs, where its destination is built.

Configuration checks ``exporter`` and ``fallback`` against it, the pipeline builds
each destination from the module it names, ``doctor`` checks each by that module's
``check``, and ``OTEL_TRACES_EXPORTER`` values map onto it (:func:`from_otel`).
A leaf: it imports nothing of the package.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

#: OpenTelemetry's variable naming the traces exporters (a comma list).
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"


@dataclass(frozen=True)
class ExporterName:
    """One name ``exporter`` (or ``fallback``) can take.

    Attributes:
        name: the configuration value.
        module: the module whose ``build(config, counts)`` makes the destination and whose
            ``check(config, environ, timeout_s)`` is ``doctor``'s check of it (None: ``auto``,
            which is a choice between two others).
        needs: the package extra it needs, if any.
        local: a local destination, which can be the ``fallback`` when RL-Insight is unusable.
        inline: no I/O, so spans skip the export queue.
        network: sends over the network (the end of a unit of work does not wait for it).
        otel: the ``OTEL_TRACES_EXPORTER`` values that select it.
        discards: what it takes is counted ``discarded``, not ``exported``.
    """

    name: str
    module: str | None
    needs: str | None = None
    local: bool = False
    inline: bool = False
    network: bool = False
    otel: tuple[str, ...] = ()
    discards: bool = False


_PACKAGE = "verl_otel_bridge._internal"

#: Every exporter name, in the order error messages list them.
NAMES: dict[str, ExporterName] = {
    entry.name: entry
    for entry in (
        ExporterName("auto", None),
        ExporterName(
            "rl_insight",
            f"{_PACKAGE}.rl_insight.exporter",
            needs="rl-insight",
            network=True,
            otel=("rl_insight",),
        ),
        ExporterName(
            "otlp",
            f"{_PACKAGE}.otlp.exporter",
            needs="otlp",
            network=True,
            otel=("otlp", "otlp_proto_http"),
        ),
        ExporterName(
            "memory",
            f"{_PACKAGE}.exporters.memory",
            local=True,
            inline=True,
        ),
        ExporterName("console", f"{_PACKAGE}.exporters.console", local=True, otel=("console",)),
        ExporterName("jsonl", f"{_PACKAGE}.exporters.jsonl", local=True),
        ExporterName(
            "none",
            f"{_PACKAGE}.exporters.discard",
            local=True,
            inline=True,
            otel=("none",),
            discards=True,
        ),
    )
}
#: The names ``fallback`` can take.
LOCAL_NAMES = tuple(name for name, entry in NAMES.items() if entry.local)
#: ``OTEL_TRACES_EXPORTER`` value -> exporter name.
OTEL_NAMES = {otel: entry.name for entry in NAMES.values() for otel in entry.otel}


def from_otel(value: str) -> str:
    """``OTEL_TRACES_EXPORTER`` text as ``exporter`` text: each known value mapped to its exporter name.

    Unknown values are kept as written, so the check of ``exporter`` names them.
    """
    names = [part.strip() for part in value.split(",") if part.strip()]
    return ",".join(dict.fromkeys(OTEL_NAMES.get(name, name) for name in names))


def destination_module(name: str) -> ModuleType:
    """The module that builds (``build(config, counts)``) and checks (``check(config, environ, timeout_s)``)
    destination ``name``, imported now.

    Raises:
        KeyError: ``name`` names no destination (``auto`` chooses between two others).
    """
    module = NAMES[name].module
    if module is None:
        raise KeyError(name)
    return importlib.import_module(module)
