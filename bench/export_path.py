"""The export path a reader has to follow: the package files whose functions run on threads other than the caller's.

Makes 20 agent-loop sessions (8 spans each) on a fresh bridge exporting to JSON Lines
(a file in a temporary directory), and again to ``otlp`` (an OTLP/HTTP receiver on
loopback, in this process), with ``threading.setprofile`` recording, on every thread
but the caller's, the file of each Python function called from the package. Prints,
per exporter, how many package files run there and which.

    python bench/export_path.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from otlp_receiver import OtlpReceiver  # tests/otlp_receiver.py

import verl_otel_bridge
from verl_otel_bridge import Bridge, BridgeConfig

PACKAGE = str(Path(verl_otel_bridge.__file__).resolve().parent) + os.sep
SESSIONS = 20


def files_off_the_caller(config: BridgeConfig) -> list[str]:
    """The package files (relative paths) whose functions ran on a thread other than this one."""
    caller = threading.get_ident()
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and threading.get_ident() != caller:
            name = frame.f_code.co_filename
            if name.startswith(PACKAGE):
                seen.add(name[len(PACKAGE) :])

    threading.setprofile(profile)
    try:
        bridge = Bridge(config)
        for s in range(SESSIONS):
            with bridge.session(sample=f"s{s}", session=0, uid=f"u{s}", global_steps=1) as session:
                with session.task("solve") as task:
                    for t in range(5):
                        with session.turn(t) as turn:
                            turn.record(prompt_tokens=10, completion_tokens=5, finish_reason="stop")
                    task.set_result(status="success", reward=1.0)
                session.finish(status="success")
        bridge.force_flush(30)
        bridge.shutdown()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    return sorted(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    results: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as directory, OtlpReceiver() as receiver:
        common = {"spill_dir": str(Path(directory, "spill")), "schedule_delay_ms": 50}
        results["jsonl"] = files_off_the_caller(
            BridgeConfig.resolve(exporter="jsonl", jsonl_path=str(Path(directory, "spans.jsonl")), **common)
        )
        results["otlp"] = files_off_the_caller(
            BridgeConfig.resolve(exporter="otlp", otlp_endpoint=receiver.url, **common)
        )
    for name, files in results.items():
        print(f"{name}: {len(files)} package files on export-side threads")
        for file in files:
            print(f"    {file}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
