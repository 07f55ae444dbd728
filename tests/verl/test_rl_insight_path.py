"""verl's own RL-Insight path through the plugin, with no code: ``trainer.logger`` naming ``rl_insight``
(verl then sets ``VERL_RL_INSIGHT_ENABLE=1`` in every process) makes every lookup verl does of
``RLInsightLogger`` get the plugin's class.

Each case is a fresh process importing verl as a run does (the plugin's hooks fire on verl's own imports):
verl's real ``Tracking`` built as ``trainer.logger=['console','rl_insight']`` builds it, logs a step, and
verl's other users of the class (the rollout servers' ``trace_state``, ``llm_server``'s registration)
call it. RL-Insight is the real 0.3.0 of this environment: usable (the integration suite's discovery
server, OTLP receiver and Ray on loopback), without a server URL, or not installed at all (this
environment's packages but RL-Insight's, linked into a new virtual environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import stack
from harness import worker_spans
from stack import PythonChild, RlInsightHub

from verl_otel_bridge._internal.verl import targets
from verl_otel_bridge._internal.verl.switch import RL_INSIGHT_LOGGER_ENV

PLUGIN_CLASS = "verl_otel_bridge._internal.verl.logger.PluginRLInsightLogger"
VERLS_CLASS = "verl.utils.tracking.RLInsightLogger"

#: A run's process: verl's Tracking as ``trainer.logger=['console','rl_insight']`` makes it (``fit`` does), a
#: logged step, the rollout server's ``trace_state`` and registration; then what each module's name is bound to,
#: the bridge's status and the log records of the package, reported as JSON.
RUN = """
import json, logging, os, sys, time
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.name, record.getMessage()])
logging.getLogger("verl_otel_bridge").addHandler(Keep(logging.INFO))
logging.getLogger("verl_otel_bridge").setLevel(logging.INFO)
tag, rl_insight = os.environ["TEST_TAG"], json.loads(os.environ["TEST_RL_INSIGHT"])
if os.environ.get("TEST_RAY_ADDRESS"):
    import ray
    ray.init(address=os.environ["TEST_RAY_ADDRESS"], runtime_env={"env_vars": json.loads(os.environ["TEST_RAY_ENV"])})
import importlib
from verl.utils.tracking import Tracking
users = {name: importlib.import_module(name) for name in json.loads(os.environ["TEST_USERS"])}
config = {"trainer": {"project_name": "proj-" + tag, "experiment_name": "exp-" + tag,
                      "logger": ["console", "rl_insight"], "rl_insight": rl_insight}}
try:
    tracking = Tracking("proj-" + tag, "exp-" + tag, default_backend=["console", "rl_insight"], config=config)
except Exception as exc:
    print("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    raise SystemExit(0)
tracking.log(data={tag + "/actor/loss": 0.25, tag + "/note": "text"}, step=1)
server_class = users["verl.workers.rollout.llm_server"].RLInsightLogger
with server_class.trace_state("vllm_generate", state_lane_id="replica_0", tag=tag):
    time.sleep(0.01)
now = time.time_ns()
server_class.trace_span("gateway_generation", start_time_ns=now - 1000, end_time_ns=now, attributes={"tag": tag})
session = server_class.agent_loop_session(sample=tag, session=0, uid="u", global_steps=1)
session.finish(trajectories=[], status="success")
import verl_otel_bridge as vob
status = vob.status()
print("RESULT " + json.dumps({
    "built": f"{type(tracking.logger['rl_insight']).__module__}.{type(tracking.logger['rl_insight']).__qualname__}",
    "bound": {name: f"{m.RLInsightLogger.__module__}.{m.RLInsightLogger.__qualname__}" for name, m in users.items()},
    "status": {k: status[k] for k in ("exporter", "reason", "detail", "counters")},
    "records": records,
}, default=str), flush=True)
if os.environ.get("STACK_CHILD_RELEASE_FILE"):
    wait_release()
tracking.finish()
"""

#: verl's modules that name ``RLInsightLogger`` and import on CPU (vLLM's and SGLang's servers need their engine,
#: a GPU package: the source-contract test checks that the table has them).
ON_CPU = sorted(
    t.module
    for t in targets.TARGETS
    if t.name == targets.RL_INSIGHT_LOGGER and not t.module.endswith(("vllm_async_server", "async_sglang_server"))
)


def run_env(tag: str, env: dict[str, str], rl_insight: dict[str, Any] | None = None) -> dict[str, str]:
    """What :data:`RUN` reads, with ``env``."""
    return {**env, "TEST_TAG": tag, "TEST_RL_INSIGHT": json.dumps(rl_insight or {}), "TEST_USERS": json.dumps(ON_CPU)}


def run(python: str, tag: str, env: dict[str, str]) -> dict[str, Any]:
    """:data:`RUN` in a fresh process of ``python``, with ``env`` over this one's."""
    done = subprocess.run(
        [python, "-c", stack.CHILD_PRELUDE + RUN],
        env={**os.environ, **run_env(tag, env)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


def warnings(result: dict[str, Any]) -> list[str]:
    return [message for level, _, message in result["records"] if level == "WARNING"]


@pytest.fixture
def selected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What ``trainer.logger`` naming ``rl_insight`` gives every process (verl's ``main_ppo`` sets it), and a state
    directory of the test's own; no RL-Insight server unless the test sets one."""
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL", raising=False)
    return {"VERL_RL_INSIGHT_ENABLE": "1", "XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.fixture(scope="session")
def python_without_rl_insight(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with every package of this environment (the plugin included) except RL-Insight: a new virtual
    environment whose one site directory links each entry of this one's but ``rl_insight``'s."""
    import site
    import sysconfig

    root = tmp_path_factory.mktemp("without-rl-insight")
    venv.create(root / "env", with_pip=False, symlinks=True)
    view = root / "site-packages"
    view.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    directories = [ours, *(Path(p) for p in site.getsitepackages() if Path(p) != ours), *map(Path, sys.path)]
    for directory in dict.fromkeys(d for d in directories if d.is_dir() and d.name == "site-packages"):
        for entry in directory.iterdir():
            if entry.name.startswith(("rl_insight", "shared.pth", "__pycache__")) or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    python = root / "env" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib, "view.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u, verl_otel_bridge; print(u.find_spec('rl_insight'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    return str(python)


def test_verls_tracking_builds_the_bridges_class_everywhere_verl_names_it(
    selected: dict[str, str], tmp_path: Path, run_tag: str
) -> None:
    """RL-Insight 0.3.0 installed, no server: every module gets the plugin's class with one INFO line; the
    trace_state and spans go to the plugin's file (not memory), the metrics are counted, one WARNING says why."""
    result = run(sys.executable, run_tag, selected)
    assert result["built"] == PLUGIN_CLASS
    assert result["bound"] == dict.fromkeys(ON_CPU, PLUGIN_CLASS)
    said = [m for level, _, m in result["records"] if level == "INFO" and "verl's RLInsightLogger" in m]
    assert said == [  # as docs/verl.md shows it
        "verl_otel_bridge: RL-Insight is selected (VERL_RL_INSIGHT_ENABLE=1), so verl's RLInsightLogger is the "
        "bridge's: RL-Insight when usable, else the plugin's local destination (VERL_OTEL_RL_INSIGHT_LOGGER=verl "
        "keeps verl's own)"
    ]
    status = result["status"]
    assert (status["exporter"], status["reason"]) == ("jsonl (fallback)", "no_server_url")
    assert (status["counters"]["verl.metrics_skipped"], status["counters"]["verl.log_degraded"]) == (2, 1)
    (warning,) = warnings(result)
    assert "RL-Insight is not usable (no_server_url)" in warning and "jsonl" in warning
    spans = worker_spans(tmp_path / "state" / "verl_otel_bridge" / "spans")
    assert sorted(s["name"] for s in spans) == ["agent_session", "gateway_generation", "vllm_generate"]
    (state,) = [s for s in spans if s["name"] == "vllm_generate"]
    assert (state["attributes"]["state_lane_id"], state["attributes"]["tag"]) == ("replica_0", run_tag)
    (session,) = [s for s in spans if s["name"] == "agent_session"]
    assert (session["attributes"]["project"], session["attributes"]["global_steps"]) == (f"proj-{run_tag}", 1)


def test_without_rl_insight_installed_verl_runs_and_traces_to_the_local_file(
    python_without_rl_insight: str, selected: dict[str, str], tmp_path: Path, run_tag: str
) -> None:
    result = run(python_without_rl_insight, run_tag, selected)
    assert result["built"] == PLUGIN_CLASS
    status = result["status"]
    assert (status["exporter"], status["reason"]) == ("jsonl (fallback)", "not_installed")
    assert status["counters"]["verl.metrics_skipped"] == 2
    (warning,) = warnings(result)
    assert "RL-Insight is not usable (not_installed)" in warning
    spans = worker_spans(tmp_path / "state" / "verl_otel_bridge" / "spans")
    assert sorted(s["name"] for s in spans) == ["agent_session", "gateway_generation", "vllm_generate"]


def test_the_setting_keeps_verls_own_class(
    python_without_rl_insight: str, selected: dict[str, str], tmp_path: Path, run_tag: str
) -> None:
    """``VERL_OTEL_RL_INSIGHT_LOGGER=verl``: verl's class everywhere; so, without RL-Insight, verl's own error."""
    result = run(python_without_rl_insight, run_tag, {**selected, RL_INSIGHT_LOGGER_ENV: "verl"})
    assert result == {"error": "ModuleNotFoundError: No module named 'rl_insight'"}
    result = run(sys.executable, run_tag, {**selected, RL_INSIGHT_LOGGER_ENV: "verl"})
    assert result["built"] == VERLS_CLASS and result["bound"] == dict.fromkeys(ON_CPU, VERLS_CLASS)
    assert not [m for _, _, m in result["records"] if "RLInsightLogger" in m]
    assert not (tmp_path / "state").exists()


def test_rl_insight_not_selected_leaves_verls_class_alone(tmp_path: Path, run_tag: str) -> None:
    result = run(sys.executable, run_tag, {"VERL_RL_INSIGHT_ENABLE": "0", "XDG_STATE_HOME": str(tmp_path)})
    assert result["built"] == VERLS_CLASS and result["bound"] == dict.fromkeys(ON_CPU, VERLS_CLASS)
    assert result["records"] == [] and not (tmp_path / "verl_otel_bridge").exists()


def test_with_rl_insight_and_its_server_the_spans_and_gauges_arrive(
    rl_insight_hub: RlInsightHub, selected: dict[str, str], tmp_path: Path, run_tag: str
) -> None:
    """The real RL-Insight 0.3.0 on loopback: the run's process (a Ray driver of its own, as verl's trainer)
    forwards the spans to RL-Insight's trace store and ``Tracking.log``'s metrics to its gauges."""
    metrics_port = stack.free_port()
    env = {
        **selected,
        "RL_INSIGHT_SERVER_URL": rl_insight_hub.server.url,
        "TEST_RAY_ADDRESS": rl_insight_hub.ray.gcs_address,
        "TEST_RAY_ENV": json.dumps(dict(rl_insight_hub.ray.env)),
    }
    rl_insight = {"prometheus": {"metrics_report_port": metrics_port}}
    with PythonChild(RUN, env=run_env(run_tag, env, rl_insight)) as child:
        result = child.result(timeout_s=180)
        mine = lambda s: s.attributes.get("tag") == run_tag or s.attributes.get("sample") == run_tag  # noqa: E731
        received = rl_insight_hub.receiver.wait_for(2, 60, where=mine)
        prefix = f"rl_insight_monitor_{run_tag}_actor_loss"

        def published() -> str | None:
            text = stack.fetch_metrics(metrics_port)
            return text if prefix in text else None

        text = stack.wait_until(
            published,
            60,
            interval_s=0.2,
            message=f"{prefix} never appeared at the hub's /metrics",
        )
        done = child.finish()
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["built"] == PLUGIN_CLASS
    status = result["status"]
    assert (status["exporter"], status["reason"]) == ("rl_insight", "ok")
    assert "verl.metrics_skipped" not in status["counters"] and warnings(result) == []
    assert {s.name for s in received} >= {"gateway_generation", "agent_session"}
    loss = [line for line in text.splitlines() if line.startswith(prefix)]
    assert loss and float(loss[0].rsplit(" ", 1)[1]) == 0.25
    assert f"{run_tag}_note" not in text  # not a number: skipped, as verl's class does
    assert worker_spans(tmp_path / "state" / "verl_otel_bridge" / "spans") == []  # nothing fell back


#: What verl's own unit tests of its class (``tests/utils/test_rl_insight_logger_on_cpu.py`` in verl's repository)
#: rely on: ``from verl.utils.tracking import RLInsightLogger`` at collection, with ``VERL_RL_INSIGHT_ENABLE``
#: unset, is verl's class, whose private state they reset; each test then sets the variable and calls the class.
VERLS_UNIT_TESTS = """
import importlib, json, os
from verl.utils.tracking import RLInsightLogger
private = ["_init_done", "_rl_insight_module", "_registered_metrics", "_warned_unsupported_features", "_get_rl_insight"]
os.environ["VERL_RL_INSIGHT_ENABLE"] = "1"  # their tests' monkeypatch.setenv, after the import
later = importlib.import_module("verl.workers.rollout.llm_server").RLInsightLogger
print("RESULT " + json.dumps({
    "class": f"{RLInsightLogger.__module__}.{RLInsightLogger.__qualname__}",
    "private": [name for name in private if not hasattr(RLInsightLogger, name)],
    "later_is_the_same": later is RLInsightLogger,
    "plugin_loaded": "verl_otel_bridge.verl.plugin" in __import__("sys").modules,
}))
"""


def test_verls_own_unit_tests_of_its_class_still_get_verls_class() -> None:
    env = {**os.environ}
    env.pop("VERL_RL_INSIGHT_ENABLE", None)
    done = subprocess.run(
        [sys.executable, "-c", VERLS_UNIT_TESTS], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line[len("RESULT ") :]) == {
        "class": VERLS_CLASS,
        "private": [],
        "later_is_the_same": True,
        "plugin_loaded": True,
    }
