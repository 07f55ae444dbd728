"""docs/protocol.md documents every span name and attribute key the protocol module declares."""

from __future__ import annotations

import re
from pathlib import Path

from verl_otel_bridge._internal import protocol

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def declared_names() -> set[str]:
    names: set[str] = set()
    for constant, value in vars(protocol).items():
        if not constant.isupper():
            continue
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, tuple):
            names.update(value)
        elif isinstance(value, dict):
            names.update(value)
            names.update(value.values())
    return names


def documented_names() -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", DOC.read_text()))


def test_every_declared_name_is_documented() -> None:
    missing = sorted(declared_names() - documented_names())
    assert not missing, f"docs/protocol.md does not mention: {missing}"


def test_the_protocol_module_is_a_leaf() -> None:
    source = Path(protocol.__file__).read_text()
    assert "import verl_otel_bridge" not in source and "from verl_otel_bridge" not in source
