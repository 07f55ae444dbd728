"""``verl-otel-bridge report`` on a planted run: two workers' captures, three steps, stragglers,
zero-advantage groups, errors, an unfinished session and a session split across the two files."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry.trace import use_span

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.identity import SessionIdentity
from verl_otel_bridge._internal.protocol import TASK_SPAN_NAME, TRACE_SOURCE, TURN_SPAN_NAME
from verl_otel_bridge._internal.report.html import nice_ticks, render_html
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.report import Report, StepReport, build_report

STEPS, UIDS, GROUP = (1, 2, 3), 4, 4
#: step -> (uid index, session) of its straggler, its duration; every other session takes 1 to 1.4 s.
STRAGGLERS = {1: (1, 2), 3: (3, 0)}
STRAGGLER_S = {1: 30.0, 3: 20.0}
#: step -> (uid index, the reward every session of that uid gets).
ZERO_ADVANTAGE = {1: (2, 0.0), 2: (0, 1.0)}
#: step -> (uid index, session) whose tool call fails.
FAILING = {2: (3, 1)}
#: Left open when its worker shuts down (step 3, uid 0, an extra session 9).
UNFINISHED = (3, 0, 9)
#: Step 2, uid 1, session 0: its session span is worker A's, one tool turn is worker B's.
SPLIT = (2, 1, 0)
CROSS_TOOL_S = 0.25


def duration_s(step: int, u: int, k: int) -> float:
    return STRAGGLER_S[step] if STRAGGLERS.get(step) == (u, k) else 1.0 + 0.1 * k + 0.01 * u


def reward(step: int, u: int, k: int) -> float:
    planted = ZERO_ADVANTAGE.get(step)
    if planted is not None and planted[0] == u:
        return planted[1]
    return round(0.1 * k + 0.05 * u + 0.01 * step, 3)


def lane(u: int, k: int) -> str:
    return SessionIdentity.create(sample=u, session=k).state_lane_id


@dataclass
class Planted:
    files: list[Path]
    #: (step, uid index, session) -> the session's real start, in ns
    starts: dict[tuple[int, int, int], int]


def _worker(path: Path) -> Bridge:
    return Bridge(BridgeConfig.resolve(environ={}, exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=10))


def _session(bridge: Bridge, step: int, u: int, k: int) -> int:
    s = bridge.start_session(sample=u, session=k, global_steps=step, uid=f"uid-{u}")
    start = s.span.start_time  # type: ignore[attr-defined]
    total = int(duration_s(step, u, k) * 1e9)
    with bridge.resume(s.identity), use_span(s.span, end_on_exit=False):
        turns = {
            0: ("generate", start, start + int(total * 0.4)),
            1: ("tool", start + int(total * 0.4), start + int(total * 0.9)),
        }
        for number, (kind, begin, end) in turns.items():
            tokens = {"prompt_tokens": 100, "completion_tokens": 20 + k} if kind == "generate" else {}
            bridge.record_span(
                TURN_SPAN_NAME,
                start_time_ns=begin,
                end_time_ns=end,
                attributes={"turn": number, "type": kind, "server.address": f"10.0.0.{u}:8000", **tokens},
            )
        bridge.record_span(
            TASK_SPAN_NAME,
            start_time_ns=start,
            end_time_ns=start + total,
            attributes={TRACE_SOURCE: "task", "task_name": "solve", "reward": reward(step, u, k)},
        )
        failing = FAILING.get(step) == (u, k)
        if failing:
            with pytest.raises(RuntimeError), bridge.span("tool_call"):
                raise RuntimeError("sandbox timed out")
    s.finish(
        status="error" if failing else "success",
        trajectories=[{"chain_id": 0, "reward_score": reward(step, u, k), "num_turns": 2}],
    )
    s.span.end(end_time=start + total)
    return int(start)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    directory = tmp_path_factory.mktemp("captures")
    files = [directory / "worker-a.jsonl", directory / "worker-b.jsonl"]
    worker_a, worker_b = _worker(files[0]), _worker(files[1])
    starts = {}
    for step in STEPS:
        for u in range(UIDS):
            for k in range(GROUP):
                starts[step, u, k] = _session(worker_a if u < 2 else worker_b, step, u, k)
    split = SessionIdentity.create(sample=SPLIT[1], session=SPLIT[2], global_steps=SPLIT[0], uid=f"uid-{SPLIT[1]}")
    with worker_b.resume(split.to_dict()):  # e.g. a tool that runs on another worker
        begin = starts[SPLIT]
        worker_b.record_span(
            TURN_SPAN_NAME,
            start_time_ns=begin,
            end_time_ns=begin + int(CROSS_TOOL_S * 1e9),
            attributes={"turn": 2, "type": "tool"},
        )
    step, u, k = UNFINISHED
    worker_b.start_session(sample=u, session=k, global_steps=step, uid=f"uid-{u}")  # never ended by the caller
    worker_a.shutdown()
    worker_b.shutdown()
    assert worker_b.status()["counters"]["unfinished"] == 1
    return Planted(files, starts)


@pytest.fixture(scope="module")
def report(planted: Planted) -> Report:
    return build_report(planted.files, top=3)


def step_of(report: Report, step: int) -> StepReport:
    return next(s for s in report.steps if s.step == step)


def test_every_step_is_reported_with_its_sessions_and_duration_percentiles(report: Report) -> None:
    assert [s.step for s in report.steps] == list(STEPS)
    assert report.bad_lines == 0 and report.outside_sessions == 0
    for step in STEPS:
        got = step_of(report, step)
        durations = sorted(duration_s(step, u, k) for u in range(UIDS) for k in range(GROUP))
        assert got.finished == UIDS * GROUP
        assert got.sessions == UIDS * GROUP + (1 if step == UNFINISHED[0] else 0)
        assert got.p50_s == pytest.approx(statistics.median(durations), abs=1e-6)
        assert got.p90_s == pytest.approx(statistics.quantiles(durations, n=10, method="inclusive")[-1], abs=1e-6)
        assert got.max_s == pytest.approx(durations[-1], abs=1e-6)


def test_the_planted_stragglers_are_named_with_their_detail(report: Report) -> None:
    for step in STEPS:
        got = step_of(report, step)
        expected = STRAGGLERS.get(step)
        assert [(s.sample, s.session) for s in got.stragglers] == (
            [(str(expected[0]), str(expected[1]))] if expected else []
        )
        assert len(got.slowest) == 3 and got.slowest == sorted(got.slowest, key=lambda s: -s.duration_s)
        everyone = sorted((duration_s(step, u, k) for u in range(UIDS) for k in range(GROUP)), reverse=True)
        assert [s.duration_s for s in got.slowest] == pytest.approx(everyone[:3], abs=1e-6)
        assert all(len(s.segments) >= 2 for s in got.slowest)  # kept for the slowest, whatever the arrival order
    slowest = step_of(report, 1).slowest[0]
    assert (slowest.uid, slowest.state_lane_id) == ("uid-1", lane(1, 2))
    assert slowest.duration_s == pytest.approx(30.0, abs=1e-6)
    assert slowest.generate_s == pytest.approx(12.0, abs=1e-6) and slowest.tool_s == pytest.approx(15.0, abs=1e-6)
    assert (slowest.turns, slowest.turn_spans, slowest.server) == (2, 2, "10.0.0.1:8000")
    assert (slowest.context_tokens, slowest.generated_tokens) == (122, 22)  # one generate turn: 100 + 22
    assert slowest.reward == reward(1, 1, 2)
    assert [g.kind for g in slowest.segments] == ["generate", "tool"]  # the waterfall's bars


def test_zero_advantage_groups_are_found_and_only_those(report: Report) -> None:
    for step in STEPS:
        planted = ZERO_ADVANTAGE.get(step)
        groups = [(g.uid, g.sessions, g.reward) for g in step_of(report, step).zero_advantage]
        assert groups == ([(f"uid-{planted[0]}", GROUP, planted[1])] if planted else [])


def test_errors_and_the_unfinished_session_are_listed(report: Report) -> None:
    errored = step_of(report, 2).errored
    assert [(s.uid, s.sample, s.session) for s in errored] == [("uid-3", "3", "1")]
    assert errored[0].error == "RuntimeError: sandbox timed out"
    # the failing tool call, and its session finished with status "error"
    assert step_of(report, 2).error_spans == 2 and step_of(report, 1).error_spans == 0
    (unfinished,) = step_of(report, 3).unfinished
    assert (unfinished.sample, unfinished.session, unfinished.status) == ("0", "9", "unfinished")
    assert all(not s.unfinished and not s.hung for s in report.steps if s.step != 3)


def test_a_session_split_across_two_files_is_one_session(report: Report, planted: Planted) -> None:
    step = step_of(report, SPLIT[0])
    assert step.finished == UIDS * GROUP  # not one more
    total = duration_s(*SPLIT)
    # One full-report session summary is only kept for the slowest; rebuild with room for all.
    everyone = {s.state_lane_id: s for s in step_of(build_report(planted.files, top=99), SPLIT[0]).slowest}
    split = everyone[lane(SPLIT[1], SPLIT[2])]
    assert split.turn_spans == 3 and split.tool_s == pytest.approx(total * 0.5 + CROSS_TOOL_S, abs=1e-6)
    assert split.turns == 2  # what its trajectory's num_turns says, not the spans seen


def test_reward_against_duration_and_turns(report: Report) -> None:
    for step in STEPS:
        got = step_of(report, step)
        keys = [(step, u, k) for u in range(UIDS) for k in range(GROUP)]
        rewards = [reward(*key) for key in keys]
        assert got.rewarded == len(keys) and got.reward_mean == pytest.approx(statistics.fmean(rewards))
        expected = statistics.correlation([duration_s(*key) for key in keys], rewards)
        assert got.reward_vs_duration == pytest.approx(expected, abs=1e-9)
        # every trajectory says num_turns 2 (the split session too: its extra turn span is not a turn of verl's)
        assert got.reward_vs_turns is None


def test_step_option_keeps_one_step(planted: Planted) -> None:
    (only,) = build_report(planted.files, step=3).steps
    assert only.step == 3 and [s.sample for s in only.stragglers] == ["3"]


def test_the_command_prints_the_answers(planted: Planted, tmp_path: Path) -> None:
    out_html = tmp_path / "report.html"
    result = CliRunner().invoke(build_cli(), ["report", *map(str, planted.files), "--html", str(out_html)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "straggler: uid 'uid-1' sample 1 session 2: 30.000 s" in text
    assert "straggler: uid 'uid-3' sample 3 session 0: 20.000 s" in text
    assert "zero advantage: uid 'uid-2': all 4 sessions got reward 0" in text
    assert "zero advantage: uid 'uid-0': all 4 sessions got reward 1" in text
    assert "RuntimeError: sandbox timed out" in text and "unfinished at shutdown" in text
    page = out_html.read_text()
    assert page == render_html(build_report(planted.files)) and "http://" not in page and "https://" not in page
    assert f'data-lane="{lane(1, 2)}"' in page

    one = CliRunner().invoke(build_cli(), ["report", *map(str, planted.files), "--step", "2"])
    assert one.exit_code == 0 and "step 2:" in one.output and "step 1:" not in one.output


#: docs/cli.md shows ``report`` on the demo's capture in the block under this mark.
CLI_MD_MARK = (
    "<!-- doc-test: checked-by tests/unit/test_report.py::test_cli_md_shows_what_report_prints_on_the_demos_capture -->"
)


def shape(text: str) -> list[str]:
    """``text``'s lines with every number masked (the demo draws its durations, tokens and rewards at random) and
    runs of spaces, which follow the numbers' widths, made one."""
    return [" ".join(re.sub(r"-?\d+(?:\.\d+)?", "0", line).split()) for line in text.strip().splitlines()]


def test_cli_md_shows_what_report_prints_on_the_demos_capture(demo_capture: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    found = re.search(re.escape(CLI_MD_MARK) + r"\n```console\n\$ verl-otel-bridge report \S+\n(.*?)```", page, re.S)
    assert found is not None, "docs/cli.md lost its report block"
    result = CliRunner().invoke(build_cli(), ["report", str(demo_capture)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert shape(found.group(1)) == shape(result.output), f"docs/cli.md shows another report; now:\n{result.output}"


def test_bad_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    capture = tmp_path / "mixed.jsonl"
    capture.write_text('not json\n{"name": "x"}\n\n')
    got = build_report([capture])
    assert (got.bad_lines, got.steps, got.spans) == (2, [], 0)
    assert [line for _, line, _ in got.bad_examples] == [1, 2]


def test_an_unwritable_html_path_is_one_clear_error(planted: Planted, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        build_cli(), ["report", str(planted.files[0]), "--html", str(tmp_path / "no" / "r.html")]
    )
    assert result.exit_code == 2 and result.exception is not None and not isinstance(result.exception, OSError)
    assert "--html" in result.output and "does not exist" in result.output


def _section(page: str, step: int) -> str:
    start = page.index(f'<section data-step="{step}"')
    return page[start : page.index("</section>", start)]


def test_the_html_marks_stragglers_errors_and_unfinished_sessions_not_the_slowest(report: Report) -> None:
    page = render_html(report)
    for step in STEPS:
        section = _section(page, step)
        scatter = section[section.index('<svg class="scatter"') :]
        marked = re.findall(r'<circle [^>]*data-marks="([^"]*)"><title>([^:]+):', scatter)
        stragglers = {lane for marks, lane in marked if "straggler" in marks}
        planted = {lane(*STRAGGLERS[step])} if step in STRAGGLERS else set()
        assert stragglers == planted, step  # not the 5 slowest: none at all in step 2
        errors = {lane for marks, lane in marked if "error" in marks}
        assert errors == ({lane(*FAILING[step])} if step in FAILING else set()), step
        assert ('<div class="legend">' in scatter) and "finished session" in scatter
    failing = re.search(
        r'<g class="session" data-lane="[^"]*sample=3/session=1/[^"]*"[^>]*>.*?</g>', _section(page, 2), re.S
    )
    assert failing is not None and 'data-marks="error"' in failing.group(0) and "[error]" in failing.group(0)
    unfinished = re.search(r'<g class="session" [^>]*data-kind="unfinished"[^>]*>', _section(page, 3))
    assert unfinished is not None and 'data-marks="unfinished"' in unfinished.group(0)
    assert "still open at shutdown" in _section(page, 3)  # the legend says what the mark means


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.129, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, 1.021, [0.0, 0.5, 1.0, 1.5]),
        (0.0, 30.0, [0.0, 10.0, 20.0, 30.0]),
        (-1.0, 1.0, [-1.0, -0.5, 0.0, 0.5, 1.0]),
        (0.5, 1.5, [0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]),
        (0.0, 0.0042, [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]),
    ],
)
def test_axis_ticks_are_round_and_cover_the_data(low: float, high: float, ticks: list[float]) -> None:
    assert nice_ticks(low, high) == ticks
