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
