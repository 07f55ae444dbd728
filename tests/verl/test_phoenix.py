"""A real verl agent-loop run (``examples/verl_agent_loop.py``: verl's ``AgentLoopWorker`` on CPU) in a real Phoenix:
every session with its first input and last output, as Phoenix's Sessions view shows them.

Phoenix is not in the verl environment: it runs from the ``backends(phoenix)`` nox
environment (``nox -s verl`` passes its ``phoenix`` command in :data:`PHOENIX_ENV`),
started as tests/backends start it. Its OTLP gRPC listener binds ``[::]``, so this
runs only in a loopback-only network namespace (``nox -s verl`` runs pytest under
``unshare -n``). The worker's destination is OpenTelemetry's
``OTEL_EXPORTER_OTLP_ENDPOINT`` alone (the plugin's default becomes ``otlp``), and
the text is turned on the documented way: verl's ``trace.token2text``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
from stack import wait_until

from verl_otel_bridge._internal.verl import destination

HERE = Path(__file__).resolve().parent
#: The ``phoenix`` command of the ``backends(phoenix)`` nox environment.
PHOENIX_ENV = "VERL_OTEL_PHOENIX"
ARRIVAL_S = 60.0
SESSIONS = 8  # the example's 2 prompts x 2 rollouts of each of its two agent loops
SESSIONS_QUERY = """{ projects { edges { node { name sessions(first: 100) { edges { node {
  sessionId numTraces firstInput { value } lastOutput { value } } } } } } } }"""
#: Each span's name, attributes (JSON text) and input, as Phoenix's span view shows it.
SPANS_QUERY = """{ projects { edges { node { name spans(first: 1000) { edges { node {
  name attributes input { value } } } } } } } }"""

_spec = importlib.util.spec_from_file_location("backends_conftest", HERE.parent / "backends" / "conftest.py")
assert _spec is not None and _spec.loader is not None
backends = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = backends  # its dataclasses look their module up
_spec.loader.exec_module(backends)

pytestmark = pytest.mark.skipif(
    not Path(os.environ.get(PHOENIX_ENV, "/nonexistent")).is_file(),
    reason=f"{PHOENIX_ENV} names no phoenix command: `nox -s verl` passes the one `nox -s 'backends(phoenix)'` "
    "built, when it runs as root (pytest in a loopback-only network namespace)",
)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not backends.loopback_only_namespace():
        pytest.fail(
            "Phoenix's OTLP gRPC listener binds [::]: run this test with `nox -s verl`, which runs pytest in a "
            "loopback-only network namespace (unshare -n; ip link set lo up)"
        )
    with backends.running_phoenix(tmp_path_factory.mktemp("phoenix"), Path(os.environ[PHOENIX_ENV])) as server:
        backends.assert_loopback_listeners(server.server)
        yield server


def sessions(phoenix: Any, project: str) -> dict[str, dict[str, Any]]:
    data = phoenix.graphql(SESSIONS_QUERY)
    node = next((e["node"] for e in data["projects"]["edges"] if e["node"]["name"] == project), None)
    return {} if node is None else {e["node"]["sessionId"]: e["node"] for e in node["sessions"]["edges"]}


@pytest.mark.timeout(900)  # Phoenix's first start (its database migration, up to START_S) and the example's run
def test_a_real_verl_run_shows_each_sessions_first_input_and_last_output_in_phoenix(
    phoenix: Any, tmp_path: Path
) -> None:
    env = {**harness.user_environment(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.server.url}
    done = subprocess.run(
        [sys.executable, str(harness.EXAMPLE), "--token2text"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "spans: otlp" in done.stdout and "verl-otel-bridge report" not in done.stdout, done.stdout
    assert not destination.default_dir(env).exists()  # the endpoint variable chose OTLP: no default directory

    def complete() -> bool:
        found = sessions(phoenix, "proj")
        return len(found) == SESSIONS and all(s["lastOutput"] for s in found.values())

    wait_until(complete, ARRIVAL_S, interval_s=0.5, message=lambda: f"Phoenix shows {sessions(phoenix, 'proj')}")
    for session_id, session in sessions(phoenix, "proj").items():
        sample = int(session_id.split("/sample=", 1)[1].split("/", 1)[0])
        assert session["numTraces"] == 1, session
        # the session's first input: its first generate turn's prompt, rebuilt by the exporter (stored once)
        assert (
            f"<|im_start|>user\n{'[tools] ' if sample < 102 else ''}question {sample - 100}"
            in session["firstInput"]["value"]
        ), session
        assert harness.FINAL_ANSWER.removesuffix("<|im_end|>") in session["lastOutput"]["value"], session
    # each LLM call shows its whole input: a tool loop's last call, its prompt with the tool replies, rebuilt
    data = phoenix.graphql(SPANS_QUERY)
    node = next(e["node"] for e in data["projects"]["edges"] if e["node"]["name"] == "proj")
    calls = [e["node"] for e in node["spans"]["edges"] if json.loads(e["node"]["attributes"]).get("type") == "generate"]
    last_calls = [c for c in calls if json.loads(c["attributes"]).get("turn", 0) > 0]
    assert len(last_calls) == 4, calls  # the tool loops' second call (2 prompts x 2 rollouts)
    for call in last_calls:
        whole = call["input"]["value"]
        assert whole.startswith("<|im_start|>user\n[tools] question ") and "<|im_start|>tool" in whole, call
        assert "appended" not in json.loads(call["attributes"]).get("input", {}), call  # the delta is not sent
