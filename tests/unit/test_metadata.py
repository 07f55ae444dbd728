"""What the package says about itself: the Pythons it claims, how to install it, the shortcuts' help."""

from __future__ import annotations

import ast
import inspect
import os
import pydoc
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import packaging
import pytest
from packaging.version import Version

import verl_otel_bridge as vob
from verl_otel_bridge import _version
from verl_otel_bridge._internal.identity import IdentityFields
from verl_otel_bridge._version import install_command

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 session
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def nox_pythons() -> tuple[str, ...]:
    """``PYTHONS`` of noxfile.py, read without importing nox."""
    for node in ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PYTHONS"]:
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("noxfile.py defines no PYTHONS")


def test_the_classifiers_claim_exactly_the_pythons_the_unit_tests_run_on() -> None:
    project = pyproject()["project"]
    claimed = [c.rpartition(" :: ")[2] for c in project["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert claimed == list(nox_pythons())
    assert project["requires-python"] == f">={nox_pythons()[0]}"


def test_typed_package_says_so_and_ships_the_marker() -> None:
    project = pyproject()
    assert "Typing :: Typed" in project["project"]["classifiers"]
    assert (ROOT / "verl_otel_bridge" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["verl_otel_bridge"]
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["keywords"]


def test_every_runtime_dependency_has_the_lower_bound_unit_oldest_installs() -> None:
    for requirement in pyproject()["project"]["dependencies"]:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+>=[0-9.]+", requirement), requirement


def test_install_command_names_this_checkout_or_a_placeholder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert install_command("cli") == f"pip install '{ROOT}[cli]'"
    monkeypatch.setattr(_version, "__file__", str(tmp_path / "site-packages" / "verl_otel_bridge" / "_version.py"))
    assert install_command("otlp") == "pip install '/path/to/verl-otel-bridge[otlp]'"


@pytest.mark.skipif(
    Version(packaging.__version__) < Version("24.2"),
    reason="setuptools>=77 builds the package only with packaging>=24.2; unit_oldest has the lower bound",
)
def test_a_copy_pip_installed_names_where_it_came_from_while_that_is_there(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "verl_otel_bridge", source / "verl_otel_bridge", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*pip, "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    ask = "import verl_otel_bridge as v, verl_otel_bridge._version as m; print(v.__file__); print(m.install_command('otlp'))"

    def said() -> list[str]:
        env = {**os.environ, "PYTHONPATH": str(site)}
        run = subprocess.run([sys.executable, "-c", ask], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.splitlines()

    assert said() == [str(site / "verl_otel_bridge" / "__init__.py"), f"pip install '{source}[otlp]'"]
    shutil.rmtree(source)  # the checkout is gone: nothing to name
    assert said()[1] == "pip install '/path/to/verl-otel-bridge[otlp]'"


def test_nothing_tells_users_to_install_from_an_index() -> None:
    """No package index serves the package: every install command points at a checkout or a wheel."""
    index_form = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?verl[-_]otel[-_]bridge\b(?!-\d)")
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "verl_otel_bridge").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in files for m in index_form.finditer(path.read_text())]
    assert found == []


@pytest.mark.parametrize(
    "shortcut", [vob.session, vob.span, vob.task, vob.turn, vob.resume, vob.traced, vob.record_span, vob.status]
)
def test_help_of_each_shortcut_describes_it(shortcut: Any) -> None:
    text = pydoc.render_doc(shortcut, renderer=pydoc.plaintext)
    method = getattr(vob.Bridge, shortcut.__name__)
    assert inspect.cleandoc(method.__doc__) in inspect.cleandoc(shortcut.__doc__)
    assert "see :meth:" not in text
    assert len(inspect.cleandoc(shortcut.__doc__).splitlines()) >= 3


def test_identity_keywords_are_typed() -> None:
    hints = get_type_hints(IdentityFields)
    assert set(hints) == {
        "sample",
        "session",
        "traj",
        "uid",
        "global_steps",
        "session_id",
        "project",
        "experiment_name",
    }
    assert all(hint is not Any for hint in hints.values()), hints
    assert hints["global_steps"] == int | None
