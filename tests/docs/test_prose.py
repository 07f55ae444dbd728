"""The docs and comments agree with the code and say why, not how things came to be."""

from __future__ import annotations

import re

import pytest

from verl_otel_bridge._internal import accounting

from .blocks import ROOT, documents

#: Phrases that narrate history instead of explaining: the reader has the code as it is.
HISTORY = re.compile(
    r"\bissues? #?\d+\b|\b(?:it|this|that|which|extra) used to\b|\bbefore (?:the|this) (?:fix|change|work)\b", re.I
)
SOURCES = ("verl_otel_bridge", "tests", "bench", "examples")


def _texts() -> list[tuple[str, str]]:
    files = [*documents(), ROOT / "noxfile.py", ROOT / "Makefile"]
    files += [path for top in SOURCES for path in (ROOT / top).rglob("*.py")]
    return [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")) for path in files]


def test_no_history_narration() -> None:
    found = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for name, text in _texts()
        if name != "tests/docs/test_prose.py"
        for match in HISTORY.finditer(text)
    ]
    assert found == []


def test_every_page_states_the_accounting_equation_of_the_code() -> None:
    equation = re.search(r"ended == [^\n]+", accounting.__doc__ or "")
    assert equation is not None
    for path in documents():
        for stated in re.findall(r"`?(ended == [^`\n]+)", path.read_text(encoding="utf-8")):
            assert stated.strip() == equation.group(0).strip(), f"{path.name}: {stated}"


def test_the_cli_package_names_every_command() -> None:
    pytest.importorskip("click")
    from verl_otel_bridge import cli
    from verl_otel_bridge.cli.app import build_cli

    commands = sorted(build_cli().commands)  # type: ignore[attr-defined]
    assert sorted(re.findall(r"``(\w+)``", (cli.__doc__ or "").partition(":")[2])) == commands


# -- pages for a user: no build machine, no history, one statement per fact ----------------------------

#: An absolute path on some machine. Allowed: the temporary directory (``/tmp/...``), the null device,
#: the ``/path/to/`` placeholder, and URL paths (``/v1/traces``, ``/api/...``), which follow a host or
#: stand alone in backquotes. A path starts a word (after a space, a quote, ``(``, ``=``, ``:`` of a
#: key) and has two parts at least, or is a top-level directory of a Unix system alone (``/data``).
ABSOLUTE_PATH = re.compile(
    r"(?<![\w.~$}\])>/-])"
    r"(?:/(?!tmp\b|dev/null\b|path/to/|v1/|api/)[A-Za-z_][\w.-]*(?:/[\w.{}*<>-]+)+"
    r"|/(?:home|root|work|workspace|data|scratch|mnt|media|opt|srv|usr|var|etc|nix|Users|Volumes)\b(?![.-]))"
)
#: A phrase that names the machine a figure or an output came from, rather than "2 cores, <CPU model>".
BUILD_MACHINE = re.compile(
    r"\b(?:this|the|that|our|my)(?: project's)?(?: \d+-core| shared| loaded| idle| same)*"
    r"(?: development| build| dev| CI| test)? (?:machine|box|host|laptop|VM)\b"
    r"|\b\d+-core (?:development |build |dev )?machine\b|\bvm-\d+\b",
    re.I,
)
#: What a page says about how it came to be: a reader has the product as it is.
PAGE_HISTORY = re.compile(r"\bas before\b|\(\d{4}-\d{2}-\d{2},\s+from\s+a\s+checkout\b", re.I)


def _findings(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    return found


def test_no_page_names_a_machines_paths() -> None:
    """No absolute path of a build machine, and no example that writes outside the working or temporary directory."""
    assert _findings(ABSOLUTE_PATH) == []


def test_no_page_names_the_machine_a_figure_came_from() -> None:
    assert _findings(BUILD_MACHINE) == []


def test_no_page_narrates_its_history() -> None:
    assert _findings(PAGE_HISTORY) == []


SHARED = re.compile(r"<!-- shared: .*? -->\n(?P<text>.*?)<!-- end shared -->", re.S)


def _shared(name: str) -> str:
    found = SHARED.search((ROOT / name).read_text(encoding="utf-8"))
    assert found is not None, f"{name} has no <!-- shared: ... --> ... <!-- end shared --> part"
    return found["text"]


def test_readme_and_the_docs_home_say_the_shared_part_word_for_word() -> None:
    """What the package is, where spans go and where the environments live: said once, in both front pages."""
    readme, index = _shared("README.md"), _shared("docs/index.md")
    assert readme.replace("](docs/", "](") == index


def test_the_shared_part_states_the_facts_of_the_code() -> None:
    from verl_otel_bridge._internal.config import FALLBACKS

    shared = " ".join(_shared("README.md").split())
    named = re.search(r"a local fallback \(([^)]*)\)", shared)
    assert named is not None
    assert re.findall(r"`(\w+)`", named.group(1)) == list(FALLBACKS)  # otlp sends over the network: not one
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert '"VERL_OTEL_NOX_DIR"' in noxfile and '".cache" / "verl-otel-bridge" / "nox"' in noxfile
    assert "`~/.cache/verl-otel-bridge/nox` (or `$VERL_OTEL_NOX_DIR`)" in shared


def test_one_statement_of_where_the_environments_live() -> None:
    """Pages other than the shared part do not place the nox environments somewhere else."""
    assert _findings(re.compile(r"`\.nox/?`|\.nox/\w")) == []
