"""What ``Bridge.status()`` returns: typed mappings for programs, and a readable text for people.

``status()`` is a plain ``dict`` (so ``json.dumps`` and ``==`` work) typed as
:class:`BridgeStatus`; ``print(status)`` (or ``str(status)``) shows
:func:`format_status`'s multi-line summary, ``repr`` the mapping.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal, TypedDict, cast


class Where(TypedDict):
    """Where a destination writes: ``endpoint`` (its URL, secrets masked) or ``path`` (the file as
    opened, ``{pid}`` expanded), None where it has none; ``last_error``: why its last batch was not
    all taken (None after a batch it took whole)."""

    endpoint: str | None
    path: str | None
    last_error: str | None


class ExporterStatus(Where):
    """One destination that was configured or received spans.

    ``role`` is ``primary`` (the first configured exporter), ``fallback`` (where
    spans go while RL-Insight is unusable) or ``copy`` (gets a copy of every batch).
    ``exported`` counts the spans it accepted, ``failed`` those it refused or that
    raised, ``spilled`` those kept on disk to be sent to it again (only the
    primary spills), ``discarded`` those ``none`` took and dropped on purpose.
    """

    role: Literal["primary", "fallback", "copy"]
    exported: int
    failed: int
    spilled: int
    discarded: int


class PendingStatus(TypedDict):
    """Spans ended but not exported yet: ``queued`` in memory (``bytes`` estimated), ``spilled`` on disk
    waiting to be sent again, and ``to``: where they are going now (as ``BridgeStatus.exporter``)."""

    queued: int
    bytes: int
    spilled: int
    to: str


class SpillStatus(TypedDict):
    """The spill: its ``dir``, newest ``file``, all ``files``, ``bytes`` on disk and ``backlog`` (spans not sent)."""

    dir: str
    file: str | None
    files: list[str]
    bytes: int
    backlog: int


class OpenSessionsStatus(TypedDict):
    """Sessions started and not ended: their ``count`` and the ``oldest`` few (see ``inflight.py``)."""

    count: int
    oldest: list[dict[str, Any]]


class BridgeStatus(TypedDict):
    """Where spans go and why, who received how many, what is pending, and the counters.

    Attributes:
        enabled: False when the config (or ``OTEL_SDK_DISABLED``) turned tracing off.
        exporter: where spans go now: ``rl_insight``, a local exporter's name, or e.g.
            ``memory (fallback)``; ``none`` when disabled.
        reason: a stable code (``ok``, ``configured``, ``disabled``, or why RL-Insight is unusable,
            see :class:`verl_otel_bridge._internal.rl_insight.compat.Probe`).
        detail: the same in one sentence.
        rl_insight_installed: whether the ``rl_insight`` module is installed.
        rl_insight_version: its ``__version__`` when RL-Insight was checked (None when absent or not checked).
        rl_insight_package_version: the installed ``rl-insight`` distribution's version (None when
            unknown or not checked), which also covers releases without ``__version__``.
        rl_insight_transport: ``hub`` or ``otlp`` (the last one used, else the configured one); None
            when RL-Insight is not wanted.
        counters: see :mod:`verl_otel_bridge._internal.accounting` (``exported`` per primary exporter).
        exporters: every destination by name, the primary first, then the fallback and the copies:
            where each writes (RL-Insight's: its OTLP endpoint once discovered) and its last error.
        pending: spans ended and not exported yet, and where they are going.
        spill: the spill files, None without a spill.
        open_sessions: sessions started and not ended.
        shut_down: whether the bridge has been shut down (its counters are then final).
    """

    enabled: bool
    exporter: str
    reason: str
    detail: str
    rl_insight_installed: bool
    rl_insight_version: str | None
    rl_insight_package_version: str | None
    rl_insight_transport: str | None
    counters: dict[str, Any]
    exporters: dict[str, ExporterStatus]
    pending: PendingStatus
    spill: SpillStatus | None
    open_sessions: OpenSessionsStatus
    shut_down: bool


class _PrintableStatus(dict[str, Any]):
    """A status mapping whose ``str()`` is the readable summary (``repr`` stays the mapping's)."""

    def __str__(self) -> str:
        return format_status(cast(BridgeStatus, self))


def printable(status: BridgeStatus) -> BridgeStatus:
    """``status`` as the mapping ``status()`` returns: equal to it, JSON-serialisable, printed as text."""
    return cast(BridgeStatus, _PrintableStatus(status))


def rl_insight_installed() -> bool:
    """Whether the ``rl_insight`` module can be imported, found without importing it."""
    try:
        return importlib.util.find_spec("rl_insight") is not None
    except (ImportError, ValueError):  # e.g. a broken entry in sys.modules
        return False


#: How to read the spans of the in-memory exporter, shown beside it.
MEMORY_HINT = "read them: vob.get_bridge().memory_exporter.get_finished_spans()"

#: Counters shown in the summary's last line, when not zero.
_COUNTERS_SHOWN = ("sampled_out", "discarded", "dropped", "failed", "invalid", "converted", "identity_lost")


def format_status(status: BridgeStatus) -> str:
    """The status as a few lines for people: where spans go and why, each destination, pending, problems."""
    counters = status["counters"]
    went = "went" if status["shut_down"] else "go"
    lines = [
        f"verl_otel_bridge: spans {went} to {status['exporter']}",
        f"  why: {status['detail']} [{status['reason']}]",
    ]
    if status["shut_down"]:
        lines.insert(1, "  (shut down: the final account of that bridge)")
    if not status["enabled"]:
        return "\n".join(lines)
    installed = "installed" if status["rl_insight_installed"] else "not installed"
    version = status["rl_insight_version"] or status["rl_insight_package_version"]
    lines.append(f"  RL-Insight: {installed}" + (f" ({version})" if version else ""))
    lines.append(f"  spans: {counters['started']} started, {counters['ended']} ended")
    if status["exporters"]:
        lines.append("  exporters:")
        width = max(len(name) for name in status["exporters"])
        for name, entry in status["exporters"].items():
            line = f"    {name:<{width}}  {entry['role']:<8}  {entry['exported']} exported"
            if entry["failed"]:
                line += f", {entry['failed']} failed"
            if entry["spilled"]:
                line += f", {entry['spilled']} spilled"
            if entry["discarded"]:
                line += f", {entry['discarded']} discarded"
            if entry["endpoint"] or entry["path"]:
                line += f"  -> {entry['endpoint'] or entry['path']}"
            if name == "memory" and entry["exported"]:
                line += f"  ({MEMORY_HINT})"
            lines.append(line)
            if entry["last_error"]:
                lines.append(f"    {'':<{width}}  last error: {entry['last_error']}")
    pending = status["pending"]
    if pending["queued"] or pending["spilled"]:
        lines.append(
            f"  pending: {pending['queued']} queued ({pending['bytes']} bytes), {pending['spilled']} spilled, "
            f"going to {pending['to']}"
        )
    else:
        lines.append("  pending: none")
    spill = status["spill"]
    if spill is not None:
        used = f"{len(spill['files'])} files, {spill['bytes']} bytes" if spill["files"] else "empty"
        lines.append(f"  spill: {spill['dir']} ({used})")
    sessions = status["open_sessions"]
    lines.append(f"  open sessions: {sessions['count']}")
    shown = [f"{key} {counters[key]}" for key in _COUNTERS_SHOWN if counters.get(key)]
    if shown:
        lines.append(f"  also: {', '.join(shown)}")
    return "\n".join(lines)
