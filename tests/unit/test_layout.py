"""The package's layout: what a bridge loads, the public modules, the old paths kept for one release."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import verl_otel_bridge as vob

PROBE = """
import json, sys
import verl_otel_bridge as vob
bridge = vob.configure(exporter=sys.argv[1], environ={})
with vob.session(sample=0, session=0):
    with vob.span("s"):
        pass
bridge.shutdown()
print(json.dumps(sorted(m for m in sys.modules if "rl_insight" in m)))
"""


def loaded_rl_insight_modules(exporter: str, cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, exporter], capture_output=True, text=True, timeout=120, check=True, cwd=cwd
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("exporter", ["memory", "jsonl", "console", "none"])
def test_a_local_bridge_loads_no_rl_insight_module(exporter: str, tmp_path: Path) -> None:
    assert loaded_rl_insight_modules(exporter, tmp_path) == []


def test_a_bridge_that_wants_rl_insight_loads_its_modules(tmp_path: Path) -> None:
    assert "verl_otel_bridge._internal.rl_insight.exporter" in loaded_rl_insight_modules("rl_insight", tmp_path)


#: The public surface besides the top-level package: every other module lives under ``_internal``.
PUBLIC_MODULES = {
    "verl_otel_bridge.__main__",
    "verl_otel_bridge._internal",
    "verl_otel_bridge._version",
    "verl_otel_bridge.cli",
    "verl_otel_bridge.propagation",
    "verl_otel_bridge.pytest_plugin",
    "verl_otel_bridge.report",
    "verl_otel_bridge.rl_insight",
    "verl_otel_bridge.testing",
    "verl_otel_bridge.verl",
}


def test_every_module_outside_the_public_surface_is_internal() -> None:
    assert {m.name for m in pkgutil.iter_modules(vob.__path__, "verl_otel_bridge.")} == PUBLIC_MODULES


#: (old documented path, its new home, a name it must give, what the warning tells to use instead)
MOVED_PATHS = [
    ("verl_otel_bridge.tree", "verl_otel_bridge._internal.tree", "render_tree", "verl_otel_bridge.testing"),
    ("verl_otel_bridge.current", "verl_otel_bridge._internal.current", "get_bridge", "verl_otel_bridge"),
    ("verl_otel_bridge.inflight", "verl_otel_bridge._internal.inflight", "InflightSessions", "_internal.inflight"),
    ("verl_otel_bridge.accounting", "verl_otel_bridge._internal.accounting", "SpanCounts", "status()"),
    ("verl_otel_bridge.otlp", "verl_otel_bridge._internal.otlp", "__path__", "_internal.otlp"),
    ("verl_otel_bridge.otlp.encoding", "verl_otel_bridge._internal.otlp.encoding", "SpanEncoder", "_internal.otlp"),
    (
        "verl_otel_bridge.exporters.vocabulary",
        "verl_otel_bridge._internal.vocabulary",
        "generic_span",
        "verl_otel_bridge.testing import generic_span",
    ),
    ("verl_otel_bridge.pipeline.chain", "verl_otel_bridge._internal.pipeline.chain", "ExportChain", "_internal"),
]


def forget_old_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the old paths from ``sys.modules`` for this test, so importing one runs the import hook again."""
    old_paths = tuple(old for old, *_ in MOVED_PATHS)
    for loaded in [m for m in sys.modules if m.startswith(old_paths)]:
        monkeypatch.delitem(sys.modules, loaded)


@pytest.mark.parametrize(("old", "new", "name", "instead"), MOVED_PATHS)
def test_a_documented_old_path_still_imports_warns_and_gives_the_same_objects(
    old: str, new: str, name: str, instead: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forget_old_paths(monkeypatch)
    with pytest.warns(DeprecationWarning) as warned:
        __import__(old)  # as an import statement does, with no importlib frame of Python's own between
    (message,) = [str(w.message) for w in warned if str(w.message).startswith(f"{old} is deprecated")]
    assert instead in message.partition(":")[2]
    module = sys.modules[old]
    assert module is importlib.import_module(new)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert module.__spec__ is not None and module.__spec__.name == new
    assert {Path(w.filename).name for w in warned} == {Path(__file__).name}  # the warning points at the importer


def test_the_top_level_functions_named_like_old_modules_stay_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    forget_old_paths(monkeypatch)
    for old, *_ in MOVED_PATHS:
        with pytest.warns(DeprecationWarning):
            importlib.import_module(old)
    assert callable(vob.status) and callable(vob.session)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("verl_otel_bridge.status")


def test_the_documented_public_names_import_from_their_documented_modules() -> None:
    from verl_otel_bridge._internal.report.aggregate import build_report as built
    from verl_otel_bridge._internal.report.html import render_html as rendered
    from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter as internal_exporter
    from verl_otel_bridge.report import build_report
    from verl_otel_bridge.report.html import render_html
    from verl_otel_bridge.testing import generic_span, render_tree

    assert (build_report, render_html) == (built, rendered)
    assert callable(generic_span) and callable(render_tree)
    (entry_point,) = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name="rl_insight")
    assert entry_point.value == "verl_otel_bridge.rl_insight.exporter:RLInsightSpanExporter"
    assert entry_point.load() is internal_exporter
