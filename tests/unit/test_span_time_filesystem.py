"""The first span never waits on the filesystem: a bridge made by a span opens its JSON Lines file on the export thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import WAIT_S

_FIRST_SPAN = """
import time
import verl_otel_bridge as vob

started = time.monotonic()
with vob.span("first"):
    pass
print(f"first span returned after {time.monotonic() - started:.3f} s", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_jsonl_path_that_blocks_when_opened_does_not_block_the_first_span(tmp_path: Path) -> None:
    fifo = tmp_path / "nobody-reads.jsonl"
    os.mkfifo(fifo, 0o600)  # opening it for writing blocks until a reader comes: none ever does
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("VERL_OTEL_BRIDGE_", "OTEL_"))},
        "VERL_OTEL_BRIDGE_EXPORTER": "jsonl",
        "VERL_OTEL_BRIDGE_JSONL_PATH": str(fifo),
        "VERL_OTEL_BRIDGE_SHUTDOWN_TIMEOUT_S": "0.5",
        "VERL_OTEL_BRIDGE_SPILL_DIR": str(tmp_path / "spill"),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _FIRST_SPAN], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = child.communicate(timeout=WAIT_S * 2)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the process hung: the first span waited on opening the FIFO\n{out}\n{err}")
    assert "first span returned" in out, (out, err)
