"""inject()/attach(): one trace and one session identity across threads of control and processes."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import pickle
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import propagate, trace
from opentelemetry.propagators.composite import CompositePropagator

import verl_otel_bridge as vob
from verl_otel_bridge._internal import propagation
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge.propagation import IDENTITY_KEY, TRACEPARENT_KEY, TRACESTATE_KEY, attach, inject
from verl_otel_bridge.testing import SpanCapture

from .helpers import forks_on_purpose, identity_of

#: Bound for a child process to finish; never reached when things work.
CHILD_TIMEOUT_S = 60.0
#: Children export only when they flush at exit (the background export would wait this long).
NEVER_MS = "600000"

TRACEPARENT_RE = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-0[0-3]$")


def hex_span_id(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


def hex_trace_id(span: Any) -> str:
    return format(span.get_span_context().trace_id, "032x")


@pytest.fixture(autouse=True)
def fresh_once_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the module's once-per-kind warnings anew."""
    monkeypatch.setattr(propagation, "_once", OnceLogger(propagation.logger))


@pytest.fixture
def sent(otel_spans: SpanCapture) -> Iterator[tuple[dict[str, str], Any, SessionIdentity]]:
    """A carrier made inside a session's ``fan_out`` span, the span, and the session identity."""
    with vob.session(sample=7, session=2, traj=1, uid="u-7", global_steps=3, project="p", experiment_name="e"):
        with vob.span("fan_out") as span:
            carrier = inject()
            identity = current_identity()
    assert identity is not None
    yield carrier, span, identity


# -- the carrier ---------------------------------------------------------------


def test_carrier_is_plain_strings_with_w3c_traceparent_and_identity_json(sent: Any) -> None:
    carrier, span, identity = sent
    assert type(carrier) is dict
    assert all(type(k) is str and type(v) is str for k, v in carrier.items())
    assert TRACEPARENT_RE.match(carrier[TRACEPARENT_KEY])
    assert carrier[TRACEPARENT_KEY].split("-")[1:3] == [hex_trace_id(span), hex_span_id(span)]
    assert json.loads(carrier[IDENTITY_KEY]) == identity.to_dict()
    assert TRACESTATE_KEY not in carrier  # nothing to carry: no empty key


def test_inject_outside_span_and_session_is_empty(otel_spans: SpanCapture) -> None:
    assert inject() == {}


def test_inject_session_without_span_has_only_identity() -> None:
    with vob.resume(SessionIdentity.create(sample=1, session=1)):
        carrier = inject()
    assert set(carrier) == {IDENTITY_KEY}


def test_an_apps_global_propagator_cannot_break_inject(
    sent: Any, otel_spans: SpanCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PROPAGATORS", "none")
    saved = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))  # an app that disabled propagation
    try:
        with vob.span("s") as span:
            carrier = inject()
            headers: dict[str, str] = {}
            propagate.inject(headers)
    finally:
        propagate.set_global_textmap(saved)
    assert headers == {}
    assert carrier[TRACEPARENT_KEY].split("-")[2] == hex_span_id(span)


def test_inject_identity_value_that_is_not_json(otel_spans: SpanCapture) -> None:
    class Steps:
        def __str__(self) -> str:
            return "step-9"

    with vob.session(sample=0, session=0, global_steps=Steps()):
        carrier = inject()
        with vob.span("sender") as sender:
            pass
    with attach(carrier):
        with vob.span("receiver") as receiver:
            pass
    assert identity_of(receiver) == identity_of(sender)


# -- attach in one process -------------------------------------------------------


@pytest.mark.parametrize("transport", ["in_process", "pickle", "json"])
def test_attach_continues_trace_and_identity(sent: Any, otel_spans: SpanCapture, transport: str) -> None:
    carrier, fan_out, identity = sent
    if transport == "pickle":
        carrier = pickle.loads(pickle.dumps(carrier))
    elif transport == "json":
        carrier = json.loads(json.dumps(carrier))
    with attach(carrier) as attached:
        assert attached == identity
        with vob.span("child") as child:
            with vob.turn(0) as turn:
                pass
    assert current_identity() is None
    assert not trace.get_current_span().get_span_context().is_valid
    for span in (child, turn.span):
        assert span.get_span_context().trace_id == fan_out.get_span_context().trace_id
        assert identity_of(span) == identity_of(fan_out)
    assert child.parent.span_id == fan_out.get_span_context().span_id
    assert turn.span.parent.span_id == child.get_span_context().span_id


def test_attach_replaces_the_receivers_own_trace_and_identity(sent: Any, otel_spans: SpanCapture) -> None:
    carrier, fan_out, _ = sent
    with vob.session(sample="receiver", session=0) as own:
        with vob.span("own") as own_span:
            with attach(carrier):
                with vob.span("attached") as attached:
                    pass
            with vob.span("after") as after:
                pass
    assert attached.parent.span_id == fan_out.get_span_context().span_id
    assert identity_of(attached) == identity_of(fan_out)
    assert after.parent.span_id == own_span.get_span_context().span_id
    assert identity_of(after) == identity_of(own.span)


def test_attach_restores_state_when_the_block_raises(sent: Any, otel_spans: SpanCapture) -> None:
    carrier, fan_out, _ = sent
    with pytest.raises(KeyError):
        with attach(carrier):
            with vob.span("failing"):
                raise KeyError("boom")
    assert current_identity() is None
    assert not trace.get_current_span().get_span_context().is_valid
    failing = otel_spans.one("failing")
    assert failing.parent.span_id == fan_out.get_span_context().span_id
    assert failing.status.status_code is trace.StatusCode.ERROR


def test_asyncio_tasks_inside_attach_inherit(sent: Any, otel_spans: SpanCapture) -> None:
    carrier, fan_out, _ = sent

    async def work(i: int) -> None:
        with vob.span(f"task-{i}"):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(work(i) for i in range(3)))

    with attach(carrier):
        asyncio.run(main())
    for i in range(3):
        span = otel_spans.one(f"task-{i}")
        assert span.parent.span_id == fan_out.get_span_context().span_id
        assert identity_of(span) == identity_of(fan_out)


def test_tracestate_travels(otel_spans: SpanCapture) -> None:
    carrier = {TRACEPARENT_KEY: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TRACESTATE_KEY: "vendor=x"}
    with attach(carrier):
        with vob.span("child") as child:
            relayed = inject()
    assert child.get_span_context().trace_state.get("vendor") == "x"
    assert relayed[TRACESTATE_KEY] == "vendor=x"
    assert format(child.parent.span_id, "016x") == "b7ad6b7169203331"


def test_unsampled_traceparent_is_honoured(otel_spans: SpanCapture) -> None:
    """A foreign tracer that sampled the request out (flags 00): spans inside are not recorded."""
    with attach({TRACEPARENT_KEY: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}):
        with vob.span("unsampled") as span:
            assert not span.is_recording()
    assert otel_spans.by_name("unsampled") == []


def test_relay_through_a_second_hop(sent: Any, otel_spans: SpanCapture) -> None:
    carrier, fan_out, _ = sent
    with attach(carrier):
        relayed = inject()  # no local span yet: the sender's span is passed on
        with vob.span("hop1") as hop1:
            onward = inject()
    with attach(pickle.loads(pickle.dumps(onward))):
        with vob.span("hop2") as hop2:
            pass
    assert relayed == carrier
    assert hop2.parent.span_id == hop1.get_span_context().span_id
    assert hex_trace_id(hop2) == hex_trace_id(fan_out)
    assert identity_of(hop2) == identity_of(fan_out)


# -- carriers that cannot be read --------------------------------------------------


class _ExplodingMapping(Mapping[str, str]):
    def __getitem__(self, key: str) -> str:
        raise RuntimeError("no")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no")

    def __len__(self) -> int:
        return 1


GOOD_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GOOD_IDENTITY = json.dumps(SessionIdentity.create(sample=1, session=2).to_dict())

UNREADABLE: dict[str, Any] = {
    "none": None,
    "empty": {},
    "str": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "int": 42,
    "list": [TRACEPARENT_KEY, GOOD_TRACEPARENT],
    "non_str_keys": {1: "x", b"traceparent": GOOD_TRACEPARENT},
    "exploding_mapping": _ExplodingMapping(),
    "traceparent_garbage": {TRACEPARENT_KEY: "garbage"},
    "traceparent_int": {TRACEPARENT_KEY: 5},
    "traceparent_bytes": {TRACEPARENT_KEY: GOOD_TRACEPARENT.encode()},
    "traceparent_zero_ids": {TRACEPARENT_KEY: "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
    "traceparent_huge": {TRACEPARENT_KEY: "00-" + "a" * 100_000},
    "identity_not_json": {IDENTITY_KEY: "{not json"},
    "identity_list": {IDENTITY_KEY: "[1, 2]"},
    "identity_missing_keys": {IDENTITY_KEY: "{}"},
    "identity_number": {IDENTITY_KEY: 3},
    "identity_deep": {IDENTITY_KEY: "[" * 100_000 + "]" * 100_000},
    "identity_lane_mismatch": {
        IDENTITY_KEY: json.dumps(
            {**json.loads(GOOD_IDENTITY), "state_lane_id": "experiment=x/sample=9/session=9/traj=9"}
        )
    },
    "unrelated_keys": {"content-type": "text/plain"},
}


#: Carriers with nothing of ours in them but nothing wrong either: attach() stays quiet.
SILENT = {"unrelated_keys"}


@pytest.mark.parametrize("kind", list(UNREADABLE))
def test_unreadable_carrier_never_raises_and_runs_without_trace_or_identity(
    kind: str, otel_spans: SpanCapture, caplog: pytest.LogCaptureFixture
) -> None:
    carrier = UNREADABLE[kind]
    caplog.set_level(logging.INFO, logger="verl_otel_bridge._internal.propagation")
    with vob.session(sample="receiver", session=0):
        with vob.span("receiver_own"):
            for _ in range(3):
                with attach(carrier) as identity:
                    assert identity is None
                    assert current_identity() is None
                    with vob.span("inside") as inside:
                        pass
    assert inside.parent is None  # a new trace, not the receiver's and not a broken one
    assert identity_of(inside) == {}
    assert len(otel_spans.by_name("inside")) == 3
    messages = [r for r in caplog.records if r.name == "verl_otel_bridge._internal.propagation"]
    assert len(messages) == (0 if kind in SILENT else 1), [r.getMessage() for r in messages]  # once, not per call
    assert all(r.levelno <= logging.WARNING for r in messages)


def test_valid_trace_with_unreadable_identity_keeps_the_trace(otel_spans: SpanCapture) -> None:
    with attach({TRACEPARENT_KEY: GOOD_TRACEPARENT, IDENTITY_KEY: "{oops"}):
        with vob.span("inside") as inside:
            pass
    assert format(inside.parent.span_id, "016x") == "b7ad6b7169203331"
    assert identity_of(inside) == {}


def test_valid_identity_with_unreadable_trace_keeps_the_identity(otel_spans: SpanCapture) -> None:
    with attach({TRACEPARENT_KEY: "zz", IDENTITY_KEY: GOOD_IDENTITY}):
        with vob.span("inside") as inside:
            pass
    assert inside.parent is None
    assert identity_of(inside) == json.loads(GOOD_IDENTITY)


def test_header_style_capitalised_keys_are_read(otel_spans: SpanCapture) -> None:
    with attach({"Traceparent": GOOD_TRACEPARENT, "Verl-Otel-Bridge-Identity": GOOD_IDENTITY}):
        with vob.span("inside") as inside:
            pass
    assert format(inside.parent.span_id, "016x") == "b7ad6b7169203331"
    assert identity_of(inside)["sample"] == "1"


def test_attach_with_a_disabled_bridge_is_harmless(sent: Any, make_bridge: Any) -> None:
    carrier, _, identity = sent
    vob.set_bridge(make_bridge(enabled=False))
    with attach(carrier, flush=True) as attached:
        with vob.span("nothing"):
            assert inject()[IDENTITY_KEY] == carrier[IDENTITY_KEY]
    assert attached == identity


identity_parts = st.one_of(st.integers(-(2**62), 2**62), st.text(max_size=20))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sample=identity_parts,
    session=identity_parts,
    traj=identity_parts,
    uid=st.none() | st.text(max_size=10),
    global_steps=st.none() | st.integers(-1, 10**9) | st.text(max_size=5),
    project=st.none() | st.text(max_size=10),
)
def test_identity_survives_inject_pickle_attach(
    otel_spans: SpanCapture, sample: Any, session: Any, traj: Any, uid: Any, global_steps: Any, project: Any
) -> None:
    with vob.session(sample=sample, session=session, traj=traj, uid=uid, global_steps=global_steps, project=project):
        with vob.span("sender") as sender:
            carrier = pickle.loads(pickle.dumps(inject()))
    with attach(carrier):
        with vob.span("receiver") as receiver:
            pass
    assert identity_of(receiver) == identity_of(sender)
    assert receiver.parent.span_id == sender.get_span_context().span_id


# -- flushing ----------------------------------------------------------------------


def _jsonl_bridge(make_bridge: Any, path: Path) -> Any:
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=int(NEVER_MS))
    vob.set_bridge(bridge)
    return bridge


def _records(*paths: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def test_attach_flush_exports_before_the_block_returns(sent: Any, make_bridge: Any, tmp_path: Path) -> None:
    carrier = sent[0]
    path = tmp_path / "spans.jsonl"
    _jsonl_bridge(make_bridge, path)
    with attach(carrier):
        with vob.span("not_flushed"):
            pass
    assert _records(path) == []  # queued: the background export would take NEVER_MS
    with attach(carrier, flush=True):
        with vob.span("flushed"):
            pass
    assert sorted(r["name"] for r in _records(path)) == ["flushed", "not_flushed"]


def test_attach_flush_also_when_the_block_raises(sent: Any, make_bridge: Any, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    _jsonl_bridge(make_bridge, path)
    with pytest.raises(ValueError):
        with attach(sent[0], flush=True):
            with vob.span("failed"):
                raise ValueError("x")
    assert [r["name"] for r in _records(path)] == ["failed"]


def test_flush_timeout_is_reported_not_raised(
    sent: Any, make_bridge: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    vob.set_bridge(make_bridge(exporter="memory"))
    monkeypatch.setattr(vob.get_bridge(), "force_flush", lambda timeout_s=30.0: False)
    with attach(sent[0], flush=True, flush_timeout_s=0.01):
        pass
    assert "did not finish exporting" in caplog.text


def test_flush_on_exit_is_only_for_multiprocessing_children() -> None:
    assert propagation.flush_on_exit() is False


# -- other processes -----------------------------------------------------------------


def _child(carrier: dict[str, str] | None, label: str, turns: int, use_attach: bool = True) -> None:
    """A worker process that never calls configure(): the environment says where spans go.

    It never flushes explicitly either: the spans reach the file only through
    the exit-time flush (the background export is set to wait ``NEVER_MS``).
    """
    if not use_attach:
        propagation.flush_on_exit()
        with vob.session(sample=f"own-{label}", session=0):
            with vob.span("own_work"):
                pass
        return
    with attach(carrier):
        if carrier is None:
            with vob.session(sample=f"own-{label}", session=0, global_steps=1):
                with vob.span("own_work"):
                    pass
            return
        with vob.span("child_work", label=label):
            for turn in range(turns):
                with vob.turn(turn):
                    pass


def _run_children(
    method: str, children: list[tuple[Any, ...]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, list[dict[str, Any]]]:
    """Start one process per ``children`` entry, each with its own JSONL file; return records per label."""
    context = multiprocessing.get_context(method)
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_SCHEDULE_DELAY_MS", NEVER_MS)
    processes: dict[str, tuple[Any, Path]] = {}
    for args in children:
        label = args[1]
        path = tmp_path / f"{method}-{label}.jsonl"
        monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(path))  # copied into the child at start()
        process = context.Process(target=_child, args=args, name=f"child-{label}")
        process.start()
        processes[label] = (process, path)
    try:
        for label, (process, _) in processes.items():
            process.join(CHILD_TIMEOUT_S)
            assert process.exitcode == 0, f"{label}: exit code {process.exitcode}"
    finally:
        for process, _ in processes.values():
            if process.is_alive():
                process.kill()
                process.join(5)
    return {label: _records(path) for label, (_, path) in processes.items()}


@pytest.mark.parametrize("method", ["fork", "spawn"])
@forks_on_purpose
def test_children_continue_the_parents_trace_and_identity(
    method: str, make_bridge: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    parent = make_bridge(exporter="memory")  # not installed as current: children start with an empty slot
    with parent.session(sample=5, session=1, global_steps=8, uid="u-5") as session:
        with parent.span("fan_out") as fan_out:
            carrier = inject()
            records = _run_children(
                method,
                [(carrier, "a", 2), (dict(carrier), "b", 1), (None, "no-carrier", 0)],
                tmp_path,
                monkeypatch,
            )
    trace_id, parent_id = hex_trace_id(fan_out), hex_span_id(fan_out)
    expected_identity = session.identity.to_dict()
    for label, turns in (("a", 2), ("b", 1)):
        spans = records[label]
        assert sorted(r["name"] for r in spans) == ["agent_turn"] * turns + ["child_work"], spans
        work = next(r for r in spans if r["name"] == "child_work")
        assert work["parent_span_id"] == parent_id
        assert work["attributes"]["label"] == label
        for record in spans:
            assert record["trace_id"] == trace_id
            assert identity_of(record["attributes"]) == expected_identity
            if record["name"] == "agent_turn":
                assert record["parent_span_id"] == work["span_id"]
    own = records["no-carrier"]
    assert sorted(r["name"] for r in own) == ["agent_session", "own_work"]
    assert all(r["trace_id"] != trace_id for r in own)
    assert all(r["attributes"]["sample"] == "own-no-carrier" for r in own)
    assert all(r["attributes"]["state_lane_id"].startswith("experiment=default/sample=own-no-carrier/") for r in own)


@forks_on_purpose
def test_fork_child_that_only_calls_flush_on_exit_keeps_its_spans(
    make_bridge: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("fork is not available on this platform")
    records = _run_children("fork", [(None, "plain", 0, False)], tmp_path, monkeypatch)
    assert sorted(r["name"] for r in records["plain"]) == ["agent_session", "own_work"]
