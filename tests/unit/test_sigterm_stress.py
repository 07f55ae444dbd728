"""SIGTERM at any point of a process busy ending spans: it always ends, of SIGTERM, with its spans written.

The handler runs between two bytecodes of whatever the main thread was doing,
perhaps holding a lock the flush needs; it must hand the flush over and never wait.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import WAIT_S

FORKER = r"""
import json, os, random, signal, sys, time
import verl_otel_bridge as vob  # imported once; each child is forked from here, so a run costs milliseconds

runs, bound_s, spill = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
chance = random.Random(20261201)
results = []
for run in range(runs):
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        vob.configure(exporter="memory", environ={}, spill_dir=spill)
        os.write(ready_w, b"r")
        n = 0
        while True:  # ends spans as fast as it can: the signal lands anywhere, locks held or not
            with vob.span("busy", n=n):
                pass
            n += 1
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    time.sleep(chance.uniform(0.0, 0.05))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + bound_s
    status = None
    while status is None and time.monotonic() < deadline:
        done, raw = os.waitpid(pid, os.WNOHANG)
        status = raw if done else None
        if status is None:
            time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        results.append("hung")
    else:
        results.append(os.waitstatus_to_exitcode(status))
print(json.dumps(results))
"""
RUNS = 150


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGTERM")
def test_sigterm_at_random_points_always_ends_the_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKER, str(RUNS), str(WAIT_S / 2), str(tmp_path / "spill")],
        capture_output=True,
        text=True,
        timeout=RUNS * WAIT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert results.count("hung") == 0, f"{results.count('hung')} of {RUNS} processes hung after SIGTERM (killed)"
    assert set(results) == {-signal.SIGTERM}, results


HANDLED = r"""
import os, signal, sys
import verl_otel_bridge as vob

wanted = int(sys.argv[1])
seen = 0

def own(signum, frame):  # the application's own handler: it counts and goes on
    global seen
    seen += 1
    os.write(1, b".")  # no lock: the test reads one byte per signal

signal.signal(signal.SIGTERM, own)
vob.configure(exporter="memory", environ={}, spill_dir=sys.argv[2])
os.write(1, b"r")
n = 0
while seen < wanted:
    with vob.span("busy", n=n):
        pass
    n += 1
print(f" {vob.status()['counters']['exported']['memory']} spans", flush=True)
"""
SIGNALS = 200


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGTERM")
def test_sigterm_again_and_again_under_an_application_handler_never_hangs(tmp_path: Path) -> None:
    chance = random.Random(1201)
    child = subprocess.Popen(
        [sys.executable, "-c", HANDLED, str(SIGNALS), str(tmp_path / "spill")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    out = child.stdout.fileno()

    def byte() -> bytes:
        ready, _, _ = select.select([out], [], [], WAIT_S)
        return os.read(out, 1) if ready else b""

    try:
        assert byte() == b"r"
        for sent in range(SIGNALS):
            select.select([], [], [], chance.uniform(0.0, 0.01))  # a random point of the busy loop
            child.send_signal(signal.SIGTERM)
            assert byte() == b".", f"signal {sent + 1}: the handler did not return within {WAIT_S} s (killed)"
        rest, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err.decode()[-2000:]
    assert rest.decode().endswith(" spans\n")
