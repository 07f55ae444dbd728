"""The fenced code blocks of README.md and docs/, with the marks that say how the tests run them.

A mark is an HTML comment on the line right before a fence (GitHub and mkdocs show neither)::

    <!-- doc-test: fragment -->                 part of a whole shown elsewhere on the page: not run alone
    <!-- doc-test: skip: REASON -->             not run, for REASON (it installs packages, needs a remote host, ...)
    <!-- doc-test: needs verl ray -->           run where these modules import (``nox -s verl``), skipped elsewhere
    <!-- doc-test: pytest -->                   a test module: run with pytest (its fixtures come from the plugin)
    <!-- doc-test: output -->                   the output of the runnable block before it, checked; ``...`` matches
                                                any text on a line, a line of its own ``...`` any number of lines
    <!-- doc-test: checked-by tests/x.py::test_y -->  output that test produces and checks (the test must exist)

Marks combine, separated by ``;`` (``<!-- doc-test: needs ray; pytest -->``); ``skip:`` comes
last, its reason is the rest of the comment. Blocks in
``python``, ``bash``/``sh`` and ``console`` (``$ command`` lines and their output) run; a
block in any other language (``yaml``, ``mermaid``, ``text``) is read, not run, and a fence
without a language is an error: the reader could not tell what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = frozenset({"python", "bash", "sh", "console"})
READ_ONLY = frozenset({"yaml", "mermaid", "text", "json", "toml"})
_MARK = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$", re.DOTALL)


def documents() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass
class Block:
    """One fenced block: where it is, its language, its code and its marks."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marks: dict[str, str] = field(default_factory=dict)
    output: Block | None = None  # the ``output`` block that follows it

    @property
    def id(self) -> str:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{where}:{self.line}"


def _marks(comment: str) -> dict[str, str] | None:
    found = _MARK.match(comment)
    if found is None:
        return None
    marks: dict[str, str] = {}
    body, skip, reason = found["body"].partition("skip:")
    if skip:
        marks["skip"] = reason.strip()
    for part in filter(str.strip, body.split(";")):
        name, _, value = part.strip().partition(" ")
        if name.endswith(":"):
            name = name[:-1]
        marks[name] = value.strip()
    return marks


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` in order; each ``output`` block is attached to the block before it."""
    found: list[Block] = []
    pending: dict[str, str] | None = None
    for token in MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8")):
        if token.type == "html_block":
            pending = _marks(token.content)
            continue
        if token.type == "fence":
            assert token.map is not None
            language = token.info.split()[0] if token.info.strip() else ""
            block = Block(path, token.map[0] + 1, language, token.content, pending or {})
            if "output" in block.marks:
                if not found:
                    raise ValueError(f"{block.id}: an output block with no block before it")
                found[-1].output = block
            found.append(block)
        pending = None
    return found


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path)]


def ellipsis_match(expected: str, actual: str) -> bool:
    """``expected`` equals ``actual`` line by line (trailing spaces aside), ``...`` matching anything."""
    pattern = []
    for line in expected.rstrip("\n").splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:.*\n)*?")
            continue
        pattern.append(".*?".join(re.escape(part) for part in line.rstrip().split("...")) + r"[ \t]*\n")
    lines = "".join(line.rstrip() + "\n" for line in actual.rstrip("\n").splitlines())
    return re.fullmatch("".join(pattern), lines) is not None
