"""``verl-otel-bridge report`` on a large capture: wall time and peak RSS (docs/performance.md).

Builds a capture of ``--spans`` spans (default 1,000,000) in two files, as two
workers would write it: sessions of 10 spans each (session, task, two generate
and two tool turns, two tool calls, a reward span, a progress record), copied
from one session the real bridge recorded, with fresh ids, times, identity and
rewards; 4 sessions per uid, 2,000 sessions per step. Then runs the command
(text report and ``--html``) in a child process and reads the child's time and
peak RSS; a child that only imports the package gives the baseline RSS.

Usage::

    python bench/report_scale.py                  # 1,000,000 spans
    python bench/report_scale.py --spans 100000 --keep /tmp/capture
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.identity import SessionIdentity
from verl_otel_bridge._internal.records import span_to_record

SESSIONS_PER_STEP, GROUP = 2000, 4


def template() -> list[dict[str, Any]]:
    """One session as the real bridge records it (10 spans)."""
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="memory", progress_interval_s=0))
    with bridge.session(sample=0, session=0, global_steps=1, uid="uid-0", session_id="conv") as s:
        with s.task("solve") as task:
            for turn in (0, 2):
                with s.turn(turn) as t:
                    t.record(prompt_tokens=300, completion_tokens=120, finish_reason="tool_calls", tools="search")
                with s.turn(turn + 1, type="tool") as t, bridge.span("tool_call"):
                    t.record(tools="search", tool_args={"query": "what is 6 x 7"})
            task.set_result(status="success", reward=0.5, finished=True)
        bridge.record_span("reward_model", start_time_ns=time.time_ns() - 1000, end_time_ns=time.time_ns())
        s.finish(status="success", trajectories=[{"chain_id": 0, "reward_score": 0.5, "num_turns": 4}])
    assert bridge.memory_exporter is not None
    spans = [span_to_record(span) for span in bridge.memory_exporter.get_finished_spans()]
    bridge.shutdown()
    progress = {
        **spans[-1],
        "name": "agent_session.progress",
        "parent_span_id": spans[-1]["span_id"],
        "attributes": {
            **{k: spans[-1]["attributes"][k] for k in SessionIdentity.create(sample=0, session=0).to_dict()},
            "progress.elapsed_s": 60.0,
            "progress.turns": 2,
            "progress.last_span": "tool_call",
            "progress.idle_s": 1.0,
        },
    }
    return [*spans, progress]


def write_capture(directory: Path, spans: int, rng: random.Random) -> list[Path]:
    session_spans = template()
    base = min(r["start_time_ns"] for r in session_spans)
    numbers = {r["span_id"]: n for n, r in enumerate(session_spans)}
    files = [directory / "worker-0.jsonl", directory / "worker-1.jsonl"]
    streams = [f.open("w") for f in files]
    for index in range(spans // len(session_spans)):
        step, within = divmod(index, SESSIONS_PER_STEP)
        sample, session = divmod(within, GROUP)
        identity = SessionIdentity.create(sample=sample, session=session, global_steps=step, uid=f"uid-{sample}")
        shift = step * 10**12 + within * 10**6 - base
        stretch = 1000 * rng.lognormvariate(0, 0.5)  # the template's milliseconds become seconds
        trace = f"{index:032x}"
        reward = float(rng.random() < 0.5)
        lines = []
        for number, record in enumerate(session_spans):
            attributes = {**record["attributes"], **identity.attributes}
            if "reward" in attributes:
                attributes["reward"] = reward
            copy = {
                **record,
                "trace_id": trace,
                "span_id": f"{index:012x}{number:04x}",
                "parent_span_id": record["parent_span_id"] and f"{index:012x}{numbers[record['parent_span_id']]:04x}",
                "start_time_ns": base + shift + int((record["start_time_ns"] - base) * stretch),
                "end_time_ns": base + shift + int((record["end_time_ns"] - base) * stretch),
                "attributes": attributes,
            }
            lines.append(json.dumps(copy))
        streams[index % 2].write("\n".join(lines) + "\n")
    for stream in streams:
        stream.close()
    return files


def run_child(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``command`` run alone in a child process."""
    script = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", script, *command], check=True, capture_output=True, text=True)
    seconds, rss_kib = out.stdout.split()
    return float(seconds), int(rss_kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="write the capture here and keep it")
    args = parser.parse_args()
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.keep or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        files = write_capture(directory, args.spans, rng)
        size = sum(f.stat().st_size for f in files) / 2**20
        print(
            f"capture: {args.spans} spans, {size:.0f} MiB in {len(files)} files ({time.perf_counter() - started:.0f} s)"
        )
        cli = [sys.executable, "-m", "verl_otel_bridge.cli", "report", *map(str, files)]
        _, baseline = run_child([sys.executable, "-c", "import verl_otel_bridge.cli.app, verl_otel_bridge.report"])
        seconds, rss = run_child([*cli, "--html", str(directory / "report.html")])
        print(
            f"report (text and --html): {seconds:.1f} s, peak RSS {rss:.0f} MiB (importing alone: {baseline:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
