"""``verl-otel-bridge watch`` following a capture while a writer makes it: CPU, lag and memory (docs/cli.md).

A writer process appends spans to a capture at ``--rate`` spans per second for
``--seconds`` (sessions of 10 spans copied from one session the real bridge recorded,
with fresh ids, times and identity; ``--sessions-per-step`` sessions per step, four per
uid), in batches every 20 ms. ``watch`` runs in its own process without a terminal
(one plain line per second). Every second the bench reads the watcher's CPU time and
resident memory from ``/proc``, and how many spans its last line says it has read
against how many the writer had written by then.

Printed: the watcher's CPU use (CPU seconds over wall seconds, after the first 5 s), the
largest lag (spans written but not yet in the watcher's last line, as seconds of writing:
a line a second, so at least about 1 s), how long after the writer stopped the last span
was shown, the load average during the run (the machine's other work shares its cores)
and the RSS at each tenth of the run.

Usage::

    python bench/watch_follow.py                                  # 20,000 spans/s for 60 s
    python bench/watch_follow.py --rate 1667 --seconds 600        # 1,000,000 spans over 10 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from report_scale import GROUP, template

from verl_otel_bridge._internal.identity import SessionIdentity

#: Placeholders in a record's JSON text, replaced per session.
_FIELDS = ("lane", "sample", "session", "uid", "step", "trace", "index", "start", "end")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def templates() -> list[str]:
    """The 10 records of one session as ``str.format`` templates of :data:`_FIELDS` (and ``n``, the span's number)."""
    records = template()
    base = min(r["start_time_ns"] for r in records)
    identity = SessionIdentity.create(sample=0, session=0).attributes
    numbers = {r["span_id"]: n for n, r in enumerate(records)}
    out = []
    for number, record in enumerate(records):
        attributes = {**record["attributes"]}
        for key in identity:
            attributes.pop(key, None)
        attributes |= {
            "state_lane_id": "@lane@",
            "sample": "@sample@",
            "session": "@session@",
            "uid": "@uid@",
            "global_steps": "@step@",
        }
        parent = record["parent_span_id"]
        copy = {
            **record,
            "trace_id": "@trace@",
            "span_id": f"@index@{number:04x}",
            "parent_span_id": f"@index@{numbers[parent]:04x}" if parent in numbers else None,
            "start_time_ns": f"@start+{record['start_time_ns'] - base}@",
            "end_time_ns": f"@start+{record['end_time_ns'] - base}@",
            "attributes": attributes,
        }
        text = json.dumps(copy).replace("{", "{{").replace("}", "}}")
        text = re.sub(r'"@start\+(\d+)@"', lambda m: "{start_" + m.group(1) + "}", text)
        text = text.replace('"@step@"', "{step}")
        for field in ("lane", "sample", "session", "uid", "trace", "index"):
            text = text.replace(f"@{field}@", "{" + field + "}")
        out.append(text + "\n")
    return out


def session_lines(texts: list[tuple[str, list[tuple[str, int]]]], index: int, per_step: int, now_ns: int) -> str:
    step, within = divmod(index, per_step)
    sample, session = divmod(within, GROUP)
    values: dict[str, Any] = {
        "lane": f"experiment=default/sample={sample}/session={session}/traj=0",
        "sample": sample,
        "session": session,
        "uid": f"uid-{sample}",
        "step": step,
        "trace": f"{index:032x}",
        "index": f"{index:012x}",
    }
    out = []
    for text, offsets in texts:
        out.append(text.format(**values, **{name: now_ns + offset for name, offset in offsets}))
    return "".join(out)


def write(path: Path, rate: int, seconds: float, per_step: int, written: list[int]) -> None:
    """Append sessions to ``path`` at ``rate`` spans per second for ``seconds``; ``written[0]``: spans so far."""
    texts = [(t, [(m, int(m.split("_")[1])) for m in re.findall(r"start_\d+", t)]) for t in templates()]
    per_session = len(texts)
    index = 0
    started = time.monotonic()
    with path.open("a") as out:
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) // per_session
            chunk = []
            while index < due:
                chunk.append(session_lines(texts, index, per_step, time.time_ns()))
                index += 1
            if chunk:
                out.write("".join(chunk))
                out.flush()
                written[0] = index * per_session
            time.sleep(0.02)


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def proc_rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000, help="spans per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sessions-per-step", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        capture = Path(scratch) / "run"
        capture.mkdir()
        path = capture / "worker-0.jsonl"
        path.touch()
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        watcher = subprocess.Popen(
            [sys.executable, "-m", "verl_otel_bridge.cli", "watch", str(capture), "--interval", "1"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert watcher.stdout is not None
        shown = [0]

        def read() -> None:
            for line in watcher.stdout:  # type: ignore[union-attr]
                found = re.search(r"; (\d+) spans, \d+ bad lines$", line.strip())
                if found:
                    shown[0] = int(found.group(1))

        threading.Thread(target=read, daemon=True).start()
        time.sleep(2)  # the watcher's start (imports), before the clock starts
        written = [0]
        writer = threading.Thread(target=write, args=(path, args.rate, args.seconds, args.sessions_per_step, written))
        started = time.monotonic()
        writer.start()
        samples: list[tuple[float, float, float, int, int]] = []  # (t, cpu s, rss MiB, written, shown)
        while writer.is_alive():
            time.sleep(1)
            samples.append(
                (time.monotonic() - started, proc_cpu_s(watcher.pid), proc_rss_mib(watcher.pid), written[0], shown[0])
            )
        writer.join()
        stopped = time.monotonic()
        while shown[0] < written[0] and time.monotonic() - stopped < 120:
            time.sleep(0.1)
        caught_up = time.monotonic() - stopped
        watcher.terminate()
        watcher.wait(timeout=60)
    warm = [s for s in samples if s[0] >= 5]
    cpu = (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0])
    lag_s = max((w - s) / args.rate for _, _, _, w, s in warm)
    print(
        f"watch following {args.rate} spans/s for {args.seconds:.0f} s ({written[0]} spans, "
        f"{args.sessions_per_step} sessions per step)"
    )
    print(
        f"  CPU: {cpu:.1%} of one core; largest lag {lag_s:.1f} s of writing; "
        f"the last span shown {caught_up:.1f} s late"
    )
    tenth = max(1, len(samples) // 10)
    rss = ", ".join(f"{t:.0f} s: {m:.0f}" for t, _, m, _, _ in samples[tenth - 1 :: tenth])
    print(f"  RSS (MiB): {rss}")
    print(f"  load average over the last minute at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
