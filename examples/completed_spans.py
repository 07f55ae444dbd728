"""Reporting work that was timed elsewhere: ``record_span`` with explicit nanosecond times.

A rollout server or a reward worker often measures its own timings and reports them
afterwards. ``record_span`` turns each report into a span with exactly those times,
parented to the current span and carrying the current session's identity.

Run: ``python examples/completed_spans.py``.
"""

from __future__ import annotations

import time

import verl_otel_bridge as vob
from verl_otel_bridge.testing import render_tree


def timings_from_inference_server(t0: int) -> list[tuple[str, int, int, dict[str, object]]]:
    """Stand-in for timings an inference server returns with its response."""
    ms = 1_000_000
    return [
        ("queue_wait", t0, t0 + 3 * ms, {"replica": 0}),
        ("prefill", t0 + 3 * ms, t0 + 9 * ms, {"prompt_tokens": 512}),
        ("decode", t0 + 9 * ms, t0 + 41 * ms, {"completion_tokens": 128}),
    ]


def main() -> None:
    bridge = vob.configure(exporter="memory", project="demo", experiment_name="completed-spans")
    with vob.session(sample=0, session=0, global_steps=1), vob.span("gateway_generation") as span:
        t0 = time.time_ns()
        for name, start, end, attributes in timings_from_inference_server(t0):
            vob.record_span(name, start_time_ns=start, end_time_ns=end, attributes=attributes)
        span.set_attribute("turn", 0)
    bridge.force_flush()
    assert bridge.memory_exporter is not None
    print(render_tree(bridge.memory_exporter.get_finished_spans()))
    vob.shutdown()


if __name__ == "__main__":
    main()
