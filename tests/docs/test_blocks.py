"""Every code block in README.md and docs/ runs as a reader would run it, and shown output is checked.

Why a collector of our own (``blocks.py``, on markdown-it-py): the Markdown-block runners on
the package index (pytest-codeblocks, pytest-markdown-docs, mktestdocs, sybil) execute Python
blocks inside the pytest process, with the namespace shared between blocks or ``__name__`` not
``"__main__"``; a reader runs a block as a script of its own, and a block that starts processes
with ``spawn`` only works that way. Each block here runs in a new interpreter, in an empty
directory, with none of the bridge's environment variables. The marks are in ``blocks.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .blocks import READ_ONLY, ROOT, RUNNABLE, Block, all_blocks, blocks, ellipsis_match

TIMEOUT_S = 240
#: The session that has verl, Ray and RL-Insight installed runs the blocks marked ``needs``.
NEEDS_SESSION = "nox -s verl"
_ISOLATED_PREFIXES = ("VERL_OTEL_BRIDGE_", "OTEL_")
_ISOLATED_NAMES = ("RL_INSIGHT_SERVER_URL", "VERL_RL_INSIGHT_ENABLE")
KNOWN_MARKS = frozenset({"fragment", "skip", "needs", "pytest", "output", "checked-by"})
#: A block that starts Ray runs in a network namespace of its own whose only interface is
#: loopback: the block stays as a reader writes it (a plain ``ray.init()``), and Ray, finding
#: no other address, listens on 127.0.0.1 only.
LOOPBACK_ONLY = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")


def _runnable() -> list[pytest.param]:
    params = []
    for block in all_blocks():
        if block.language not in RUNNABLE or {"fragment", "skip", "output", "checked-by"} & block.marks.keys():
            continue
        label = f"needs {block.marks['needs']}" if "needs" in block.marks else block.language
        params.append(pytest.param(block, id=f"{block.id}[{label}]"))
    return params


def reader_env(directory: Path) -> dict[str, str]:
    """The environment of a reader who has just installed the package: this interpreter first on PATH."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_ISOLATED_PREFIXES) and name not in _ISOLATED_NAMES
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["TMPDIR"] = str(directory)  # the default spill directory lives under it
    env["PYTHONPATH"] = str(ROOT)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "120"
    return env


def _run(command: list[str], directory: Path, *, loopback_only: bool = False) -> subprocess.CompletedProcess[str]:
    if loopback_only:
        if shutil.which("unshare") is None or os.geteuid() != 0:
            pytest.skip("a block that starts Ray runs in a loopback-only network namespace: needs unshare and root")
        command = [*LOOPBACK_ONLY, *command]
    return subprocess.run(
        command, cwd=directory, env=reader_env(directory), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def run_block(block: Block, directory: Path) -> str:
    """Run ``block`` in ``directory``; its standard output. Fails the test when it fails or its shown output differs."""
    if block.language == "console":
        return _run_console(block, directory)
    loopback_only = "ray" in block.marks.get("needs", "").split()
    if block.language == "python":
        script = directory / ("test_block.py" if "pytest" in block.marks else "block.py")
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
        done = _run(
            command if "pytest" in block.marks else [sys.executable, script.name],
            directory,
            loopback_only=loopback_only,
        )
    else:
        done = _run(["bash", "-eo", "pipefail", "-c", block.code], directory, loopback_only=loopback_only)
    assert done.returncode == 0, f"{block.id} failed ({done.returncode}):\n{block.code}\n{done.stdout}\n{done.stderr}"
    if block.output is not None:
        shown = block.output.code
        assert ellipsis_match(shown, done.stdout), (
            f"{block.output.id} shows\n{shown}\nbut the block printed\n{done.stdout}"
        )
    return done.stdout


def _run_console(block: Block, directory: Path) -> str:
    """``$ command`` lines: each runs, and the lines after it are its shown output."""
    printed = []
    for chunk in ("\n" + block.code).split("\n$ ")[1:]:
        command, _, shown = chunk.partition("\n")
        done = _run(["bash", "-eo", "pipefail", "-c", command], directory)
        assert done.returncode == 0, (
            f"{block.id}: `{command}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
        assert ellipsis_match(shown, done.stdout), (
            f"{block.id}: `{command}` is shown printing\n{shown}\nbut printed\n{done.stdout}"
        )
        printed.append(done.stdout)
    return "".join(printed)


@pytest.fixture
def reader_dir() -> Iterator[Path]:
    """An empty directory with a short path: Ray's sockets under its TMPDIR must fit 107 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="doc-block-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("block", _runnable())
def test_block_runs(block: Block, reader_dir: Path) -> None:
    for module in block.marks.get("needs", "").split():
        pytest.importorskip(module, reason=f"{block.id} needs {module}: it runs in {NEEDS_SESSION}")
    run_block(block, reader_dir)


def test_every_block_says_what_it_is() -> None:
    """A language the tests know, marks they know, and a reason for every skip."""
    problems = []
    for block in all_blocks():
        if block.language not in RUNNABLE | READ_ONLY:
            problems.append(f"{block.id}: language {block.language!r} is neither run nor read-only")
        if unknown := block.marks.keys() - KNOWN_MARKS:
            problems.append(f"{block.id}: unknown marks {sorted(unknown)}")
        if "skip" in block.marks and not block.marks["skip"]:
            problems.append(f"{block.id}: skip without a reason")
        if "output" in block.marks and block.language in RUNNABLE:
            problems.append(f"{block.id}: an output block in a runnable language (use text)")
    assert problems == []


def test_checked_by_names_a_test_that_exists() -> None:
    for block in all_blocks():
        if target := block.marks.get("checked-by"):
            module, _, name = target.partition("::")
            source = (ROOT / module).read_text(encoding="utf-8")
            assert f"def {name}(" in source, f"{block.id}: {target} does not exist"


def test_a_broken_block_and_wrong_output_fail(tmp_path: Path) -> None:
    """The harness itself: a block that raises fails, and so does output that differs from what is shown."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint('hello', 41 + 1)\n```\n\n<!-- doc-test: output -->\n```text\nhello ...\n```\n\n"
        "```python\nprint('hello')\n```\n\n<!-- doc-test: output -->\n```text\nbye\n```\n\n"
        "<!-- doc-test: fragment -->\n```python\nundefined_name\n```\n",
        encoding="utf-8",
    )
    ok, wrong, fragment = (block for block in blocks(page) if "output" not in block.marks)
    assert run_block(ok, tmp_path) == "hello 42\n"
    with pytest.raises(AssertionError, match="shows"):
        run_block(wrong, tmp_path)
    assert fragment.marks == {"fragment": ""}
    with pytest.raises(AssertionError, match="failed"):
        run_block(fragment, tmp_path)


@pytest.mark.parametrize(
    ("shown", "printed", "matches"),
    [
        ("a ... c\n", "a b c\n", True),
        ("a\n...\nd\n", "a\nb\nc\nd\n", True),
        ("a\n...\nd\n", "a\nd\n", True),
        ("a b\n", "a c\n", False),
        ("a\n", "a\nb\n", False),
    ],
)
def test_ellipsis_matching(shown: str, printed: str, matches: bool) -> None:
    assert ellipsis_match(shown, printed) is matches
