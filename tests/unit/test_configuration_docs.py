"""docs/configuration.md's table of keys says what each key's declaration says."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from verl_otel_bridge import BridgeConfig
from verl_otel_bridge._internal.config import environment_variables, settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row; a ``|`` inside backticks (``str | None``) is not a separator."""
    cells, current, in_code = [], "", False
    for char in line.strip()[1:-1]:
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(current.strip())
            current = ""
        else:
            current += char
    return [*cells, current.strip()]


def _doc_table(page: Path) -> dict[str, list[str]]:
    """Rows of the reference table (the one whose header starts with ``| key |``), by key."""
    rows: dict[str, list[str]] = {}
    in_table = False
    for line in page.read_text().splitlines():
        if line.startswith("| key |"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and line.startswith("|"):
            cells = _cells(line)
            rows[cells[0].strip("`")] = cells
        elif in_table:
            break
    return rows


def _shown_default(value: Any) -> str:
    return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"


def test_configuration_reference_matches_the_declaration() -> None:
    rows = _doc_table(PAGE)
    assert list(rows) == list(settings()), "one row per key, in declaration order"
    for f in dataclasses.fields(BridgeConfig):
        _key, type_, default, environment, meaning = rows[f.name]
        assert type_ == f"`{f.type}`", f.name
        assert default == _shown_default(f.default), f.name
        assert re.findall(r"`([A-Z][A-Z0-9_]+)`", environment) == list(environment_variables(f.name)), f.name
        assert meaning and settings()[f.name].doc, f.name
