"""The bridge's session identity equals the REAL ``rl_insight.agent_loop.agent_loop_session(...).identity``.

The dashboard groups and filters spans by these keys, and RL-Insight 0.3.0 is
the reference: same keys, same order, same values, same types (an integer
``global_steps`` must stay an integer for TraceQL's numeric comparison).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from stack import RlInsightHub

import verl_otel_bridge as vob
from verl_otel_bridge import SessionIdentity
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

pytestmark = pytest.mark.rl_insight("0.3.0")


class Weird:
    """An object whose text form is all that identity keeps."""

    def __str__(self) -> str:
        return "weird/obj with space"


# agent_loop_session's keyword arguments (experiment_name is required there, so always given).
CASES: list[dict[str, Any]] = [
    dict(experiment_name="e", sample=0, session=0),
    dict(experiment_name="e", sample=1, session=2, traj=3, uid="u", global_steps=4, session_id="s"),
    dict(
        project=None,
        experiment_name="e",
        sample=None,
        session=None,
        traj=None,
        uid=None,
        global_steps=None,
        session_id=None,
    ),
    dict(project="p", experiment_name="exp/with/slashes", sample="a/b", session="c d", traj="t/1"),
    dict(project="proj with spaces", experiment_name="exp with spaces", sample=" lead", session="trail ", uid=" "),
    dict(experiment_name=7, sample=8, session=9, traj=10, uid=11, global_steps=12, session_id=13),
    dict(experiment_name="e", sample=1.5, session=-2, traj=0.0, uid=3.25, global_steps=3.0),
    dict(experiment_name="e", sample=0, session=0, global_steps=0),  # 0 is not None: stays 0, not ""
    dict(experiment_name="e", sample=0, session=0, global_steps=-1),
    dict(experiment_name="e", sample=0, session=0, global_steps=2**40),
    dict(experiment_name="e", sample=0, session=0, global_steps=True),  # a bool stays a bool
    dict(project=False, experiment_name="e", sample=True, session=False, uid=False, session_id=True),
    dict(experiment_name="e", sample=0, session=0, global_steps="3"),  # a string stays a string
    dict(experiment_name="e", sample=0, session=0, global_steps=""),
    dict(project="", experiment_name="", sample="", session="", traj="", uid="", session_id=""),
    dict(project=0, experiment_name=0, sample=0, session=0, traj=0, uid=0, session_id=0),
    dict(experiment_name="é/実験", sample="サンプル", session="séance", uid="ü", session_id="会話 1"),
    dict(experiment_name="line\nbreak", sample="tab\there", session='q"uote', traj="back\\slash"),
    dict(experiment_name="e", sample="experiment=x/sample=y", session="traj=z"),  # lane-id lookalikes
    dict(experiment_name="e", sample=Weird(), session=Weird(), uid=Weird(), session_id=Weird()),
    dict(project=12.5, experiment_name=1e-9, sample=float("inf"), session=-0.0, traj=2**64),
    dict(experiment_name="e", sample=3, session=1, traj=2, uid="uid-3", global_steps=17, session_id="conv-3-1"),
    dict(project="p", experiment_name="e", sample=0, session=0, global_steps=1.5),
    dict(experiment_name="e", sample=(1, 2), session=[3, "x"], uid={"k": "v"}),  # containers: their text
]


def _real_identity(case: dict[str, Any]) -> dict[str, Any]:
    from rl_insight.agent_loop import agent_loop_session

    return dict(agent_loop_session(**case).identity)


def _typed(mapping: dict[str, Any]) -> list[tuple[str, type, Any]]:
    """Key order, value types and values, so ``3 == 3.0 == True`` cannot hide a difference."""
    return [(key, type(value), value) for key, value in mapping.items()]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_identity_equals_rl_insight_0_3_0(case: dict[str, Any]) -> None:
    real = _real_identity(case)
    assert list(real) == list(IDENTITY_KEYS)  # the reference's own keys, in order
    ours = SessionIdentity.create(**case).to_dict()
    assert _typed(ours) == _typed(real)
    # and it survives the hand-off to tools (to_dict -> from_dict)
    assert _typed(SessionIdentity.from_dict(ours).to_dict()) == _typed(real)


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_session_span_carries_exactly_that_identity(
    case: dict[str, Any], make_bridge: Callable[..., vob.Bridge]
) -> None:
    real = _real_identity(case)
    bridge = make_bridge(exporter="memory")
    with bridge.session(**case):
        with bridge.span("inside"):
            pass
    spans = bridge.memory_exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["agent_session", "inside"]
    for span in spans:
        attributes = dict(span.attributes or {})
        assert _typed({key: attributes[key] for key in IDENTITY_KEYS if key in attributes}) == _typed(real), span.name


def test_identities_reach_rl_insight_unchanged(
    rl_insight_hub: RlInsightHub, make_bridge: Callable[..., vob.Bridge], run_tag: str
) -> None:
    """Through the hub, each session span's identity is still the reference's (as OTLP decodes it)."""
    bridge = make_bridge(
        exporter="rl_insight",
        rl_insight_transport="hub",
        rl_insight_server_url=rl_insight_hub.server.url,
        schedule_delay_ms=50,
    )
    expected = {}
    for index, case in enumerate(CASES):
        tagged = {**case, "session_id": f"{run_tag}-{index}"}
        with bridge.session(**tagged):
            pass
        expected[tagged["session_id"]] = _real_identity(tagged)
    assert bridge.force_flush(30)
    received = rl_insight_hub.receiver.wait_for(
        len(CASES), 60, where=lambda s: str(s.attributes.get("session_id", "")).startswith(run_tag)
    )
    assert len(received) == len(CASES)
    for span in received:
        real = expected[span.attributes["session_id"]]
        assert _typed({key: span.attributes[key] for key in IDENTITY_KEYS}) == _typed(real)
