"""``report`` on the trainer's side of a capture: the capture tests/verl/test_trainer.py wrote of two real
training steps (the trainer's spans and its Ray workers'), read as it is and shuffled."""

from __future__ import annotations

import random
import re
from pathlib import Path

from click.testing import CliRunner

from verl_otel_bridge._internal.report.phases import phase_rows
from verl_otel_bridge.cli import app as cli
from verl_otel_bridge.report import build_report

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "browser" / "fixtures" / "verl-training-steps.jsonl"


def test_each_step_has_its_phases_metrics_and_the_sessions_under_gen() -> None:
    report = build_report([CAPTURE])
    assert [s.step for s in report.steps] == [1, 2]
    for step in report.steps:
        trainer = step.trainer
        assert trainer is not None and trainer.step == step.step and not trainer.error
        assert [(p.name, p.depth) for p in trainer.phases] == [
            ("start_profile", 0),
            ("step", 0),
            ("gen", 1),
            ("reward", 1),
            ("adv", 1),
            ("stop_profile", 0),
        ]
        top = [p for p in trainer.phases if p.depth == 0]
        assert sum(p.seconds for p in top) <= trainer.seconds
        under_gen = trainer.sessions_under("gen")
        assert len(under_gen) == step.sessions == 4
        gen = next(p for p in trainer.phases if p.name == "gen")
        assert all(gen.start_ns <= s.start_ns <= s.end_ns <= gen.end_ns for s in under_gen)
        assert trainer.metrics["training/global_step"] == step.step and "timing_s/gen" in trainer.metrics
        rows = {row["phase"].strip(): row for row in phase_rows(trainer)}
        assert rows["gen"]["sessions"] == "4" and rows["gen"]["share"].endswith("%")
        assert rows["gen"]["slowest s"] == f"{max(s.seconds for s in under_gen):.3f}"


def test_records_in_any_order_give_the_same_steps(tmp_path: Path) -> None:
    lines = CAPTURE.read_text().splitlines()
    random.Random(7).shuffle(lines)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    expected = [(s.step, s.trainer) for s in build_report([CAPTURE]).steps]
    assert [(s.step, s.trainer) for s in build_report([shuffled]).steps] == expected


def test_the_cli_prints_the_phase_breakdown_of_one_step() -> None:
    done = CliRunner().invoke(cli.build_cli(), ["report", str(CAPTURE), "--step", "2"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert done.output.count("phases: training_step") == 1
    (gen,) = [line.split() for line in done.output.splitlines() if re.fullmatch(r"gen +[\d.]+ +\d+%.*", line.strip())]
    assert gen[2].endswith("%") and gen[3] == "4"


def test_the_phase_breakdown_verl_md_shows_is_the_reports() -> None:
    page = (ROOT / "docs" / "verl.md").read_text(encoding="utf-8")
    found = re.search(r"test_the_phase_breakdown_verl_md_shows_is_the_reports -->\n```text\n(.*?)```", page, re.S)
    assert found is not None
    done = CliRunner().invoke(cli.build_cli(), ["report", str(CAPTURE)], catch_exceptions=False)
    printed = [line.rstrip() for line in done.output.splitlines()]
    shown = [line.rstrip() for line in found.group(1).splitlines()]
    start = printed.index(shown[0])
    assert printed[start : start + len(shown)] == shown
