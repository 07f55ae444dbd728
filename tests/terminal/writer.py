"""A training run writing its capture while ``watch`` reads it, one stage per line the test sends on stdin.

Stages (each ends with the spans on disk, then ``ready <stage>`` on stdout):

``first``   step 1: eight finished sessions (uid-0 and uid-1, four each; every session of uid-1 gets reward 1)
``second``  step 2: three finished sessions, one more whose search tool fails, and one that hangs in ``tool_call``
            (uid-9; progress records every 0.2 s)
``third``   step 2: four more finished sessions
``exit``    shut the bridge down and end

Session durations are planted (explicit end times), so the slowest sessions are the same every run.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from opentelemetry.trace import use_span

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.protocol import TURN_SPAN_NAME

PROGRESS_INTERVAL_S = 0.2
HUNG_UID = "uid-9"
ERROR_TEXT = "search failed: sandbox timed out"
AGENT = "tool_agent"


class ToolError(RuntimeError):
    """What the failing search tool raises."""


def finished(bridge: Bridge, step: int, sample: int, k: int, seconds: float, reward: float) -> None:
    s = bridge.start_session(sample=sample, session=k, global_steps=step, uid=f"uid-{sample}")
    start = s.span.start_time  # type: ignore[attr-defined]
    total = int(seconds * 1e9)
    with bridge.resume(s.identity), use_span(s.span, end_on_exit=False):
        bridge.record_span(
            TURN_SPAN_NAME,
            start_time_ns=start,
            end_time_ns=start + total // 2,
            attributes={"turn": 0, "type": "generate", "prompt_tokens": 200 + 10 * k, "completion_tokens": 50 + k},
        )
        bridge.record_span(
            TURN_SPAN_NAME,
            start_time_ns=start + total // 2,
            end_time_ns=start + total,
            attributes={"turn": 1, "type": "tool", "tools": "search"},
        )
    s.finish(
        status="success", runner_name=AGENT, trajectories=[{"chain_id": 0, "reward_score": reward, "num_turns": 2}]
    )
    s.span.end(end_time=start + total)


def failing(bridge: Bridge, step: int, sample: int, k: int) -> None:
    with bridge.session(sample=sample, session=k, global_steps=step, uid=f"uid-{sample}") as s:
        try:
            with s.turn(0, type="tool", tools="search"):
                raise ToolError(ERROR_TEXT)
        except ToolError:
            pass
        s.finish(status="error", runner_name=AGENT, trajectories=[{"chain_id": 0, "reward_score": 0.0, "num_turns": 1}])


def hang(bridge: Bridge, step: int, stop: threading.Event) -> None:
    with bridge.session(sample=9, session=0, global_steps=step, uid=HUNG_UID) as s:
        with s.turn(0):
            pass
        with bridge.span("tool_call"):
            stop.wait()


def main(directory: Path) -> None:
    bridge = Bridge(
        BridgeConfig.resolve(
            environ={},
            exporter="jsonl",
            jsonl_path=str(directory / "worker-0.jsonl"),
            schedule_delay_ms=50,
            progress_interval_s=PROGRESS_INTERVAL_S,
        )
    )
    stop = threading.Event()
    hung = threading.Thread(target=hang, args=(bridge, 2, stop), daemon=True)
    for line in sys.stdin:
        stage = line.strip()
        if stage == "first":
            for k in range(4):
                finished(bridge, 1, 0, k, 2.0 + 0.5 * k, 0.25 * k)
                finished(bridge, 1, 1, k, 1.0 + 0.1 * k, 1.0)
        elif stage == "second":
            for k in range(3):
                finished(bridge, 2, 2, k, 3.0 + k, 0.5)
            failing(bridge, 2, 3, 0)
            hung.start()
        elif stage == "third":
            for k in range(4):
                finished(bridge, 2, 4, k, 1.5 + 0.25 * k, 0.75)
        elif stage == "exit":
            break
        assert bridge.force_flush(30)
        print(f"ready {stage}", flush=True)
    stop.set()
    if hung.is_alive():
        hung.join(30)
    bridge.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
