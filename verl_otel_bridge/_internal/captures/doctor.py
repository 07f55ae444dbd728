"""What ``doctor`` says about a capture directory: whether the ``jsonl`` exporter can write it, and what it holds.

Only names and sizes are read (never a file's content), without following links,
and at most :data:`MAX_RUNS` runs are described.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.captures.budget import step_sizes
from verl_otel_bridge._internal.captures.run import run_folder
from verl_otel_bridge._internal.config import BridgeConfig

#: Runs described by :func:`describe_runs` at most (the newest first).
MAX_RUNS = 10


def check_capture_dir(config: BridgeConfig) -> dict[str, Any]:
    """``{"ok", "detail"}``: whether the run folder of ``config`` can be written, where, and the budget."""
    folder = run_folder(config).absolute()
    nearest = next((p for p in folder.parents if p.exists()), Path("/"))
    writable = nearest.is_dir() and not nearest.is_symlink() and os.access(nearest, os.W_OK | os.X_OK)
    budget = (
        "no disk budget"
        if config.capture_max_bytes == 0
        else f"disk budget {config.capture_max_bytes} bytes"
        if config.capture_max_bytes
        else "disk budget: a quarter of the free space when the run starts"
    )
    free = _free(nearest)
    where = f"gzip JSON Lines in {folder}/global_steps=<n>/ ({budget}; {free} bytes free there)"
    return {"ok": writable, "detail": where if writable else f"{nearest} cannot be written: {where}"}


def describe_runs(capture_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run folders in ``capture_dir``, newest first: name, steps, newest step, files and bytes."""
    base = Path(capture_dir).expanduser()
    try:
        runs = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return []
    runs.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
    described = []
    for entry in runs[:MAX_RUNS]:
        try:
            steps, total = step_sizes(Path(entry.path))
        except OSError:
            continue
        numbered = [s for s in steps if isinstance(s, int)]
        described.append(
            {
                "run": entry.name,
                "steps": len(numbered),
                "newest_step": max(numbered) if numbered else None,
                "files": sum(files for _size, files in steps.values()),
                "bytes": total,
            }
        )
    return described


def _free(path: Path) -> int:
    try:
        info = os.statvfs(path)
    except OSError:
        return 0
    return info.f_bavail * info.f_frsize
