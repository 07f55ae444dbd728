"""SessionIdentity equals what RL-Insight 0.3.0's ``agent_loop_session`` builds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_otel_bridge import SessionIdentity

# (arguments to create / agent_loop_session, the identity dict RL-Insight 0.3.0 builds), written out by hand.
IDENTITY_TABLE: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {"experiment_name": "exp", "sample": 0, "session": 0},
        {
            "project": "",
            "experiment_name": "exp",
            "sample": "0",
            "session": "0",
            "traj": "0",
            "state_lane_id": "experiment=exp/sample=0/session=0/traj=0",
            "uid": "",
            "global_steps": "",
            "session_id": "",
        },
    ),
    (
        {
            "project": "p",
            "experiment_name": "exp",
            "sample": 3,
            "session": 7,
            "traj": 2,
            "uid": 11,
            "global_steps": 5,
            "session_id": 99,
        },
        {
            "project": "p",
            "experiment_name": "exp",
            "sample": "3",
            "session": "7",
            "traj": "2",
            "state_lane_id": "experiment=exp/sample=3/session=7/traj=2",
            "uid": "11",
            "global_steps": 5,
            "session_id": "99",
        },
    ),
    (
        {
            "project": 0,
            "experiment_name": 1,
            "sample": "s",
            "session": "t",
            "traj": "u",
            "uid": 0,
            "global_steps": 0,
            "session_id": "",
        },
        {
            "project": "0",
            "experiment_name": "1",
            "sample": "s",
            "session": "t",
            "traj": "u",
            "state_lane_id": "experiment=1/sample=s/session=t/traj=u",
            "uid": "0",
            "global_steps": 0,
            "session_id": "",
        },
    ),
    (
        {"experiment_name": "e", "sample": 1.5, "session": 2.0, "traj": 0.25, "uid": 3.0, "global_steps": 2.5},
        {
            "project": "",
            "experiment_name": "e",
            "sample": "1.5",
            "session": "2.0",
            "traj": "0.25",
            "state_lane_id": "experiment=e/sample=1.5/session=2.0/traj=0.25",
            "uid": "3.0",
            "global_steps": 2.5,
            "session_id": "",
        },
    ),
    (
        {
            "experiment_name": True,
            "sample": True,
            "session": False,
            "traj": False,
            "uid": True,
            "global_steps": True,
            "session_id": False,
        },
        {
            "project": "",
            "experiment_name": "True",
            "sample": "True",
            "session": "False",
            "traj": "False",
            "state_lane_id": "experiment=True/sample=True/session=False/traj=False",
            "uid": "True",
            "global_steps": True,
            "session_id": "False",
        },
    ),
    (
        {
            "project": "my proj",
            "experiment_name": "exp one/two",
            "sample": "a/b",
            "session": "s 1",
            "traj": "t/0",
            "uid": "u id/1",
            "global_steps": "7",
            "session_id": "x y",
        },
        {
            "project": "my proj",
            "experiment_name": "exp one/two",
            "sample": "a/b",
            "session": "s 1",
            "traj": "t/0",
            "state_lane_id": "experiment=exp one/two/sample=a/b/session=s 1/traj=t/0",
            "uid": "u id/1",
            "global_steps": "7",
            "session_id": "x y",
        },
    ),
]


@pytest.mark.parametrize(("kwargs", "expected"), IDENTITY_TABLE)
def test_identity_matches_rl_insight_0_3_0(kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    identity = SessionIdentity.create(**kwargs).to_dict()
    assert identity == expected
    assert list(identity) == list(expected)  # same key order as RL-Insight
    assert type(identity["global_steps"]) is type(expected["global_steps"])


@pytest.mark.parametrize(("kwargs", "expected"), IDENTITY_TABLE)
def test_identity_attributes_equal_the_dict(kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    assert dict(SessionIdentity.create(**kwargs).attributes) == expected


def test_global_steps_int_stays_int_and_none_becomes_empty() -> None:
    assert SessionIdentity.create(sample=0, session=0, global_steps=12).global_steps == 12
    assert type(SessionIdentity.create(sample=0, session=0, global_steps=12).global_steps) is int
    assert SessionIdentity.create(sample=0, session=0, global_steps=None).global_steps == ""


def test_experiment_name_defaults_to_default() -> None:
    identity = SessionIdentity.create(sample=1, session=2)
    assert identity.experiment_name == "default"
    assert identity.state_lane_id == "experiment=default/sample=1/session=2/traj=0"


@pytest.mark.parametrize(("kwargs", "_"), IDENTITY_TABLE)
def test_json_round_trip(kwargs: dict[str, Any], _: Any) -> None:
    identity = SessionIdentity.create(**kwargs)
    rebuilt = SessionIdentity.from_dict(json.loads(json.dumps(identity.to_dict())))
    assert rebuilt == identity
    assert rebuilt.to_dict() == identity.to_dict()
    assert dict(rebuilt.attributes) == dict(identity.attributes)


_scalars = st.one_of(st.none(), st.integers(), st.text(max_size=12), st.booleans())


@given(
    sample=_scalars.filter(lambda v: v is not None),
    session=_scalars.filter(lambda v: v is not None),
    traj=_scalars.filter(lambda v: v is not None),
    uid=_scalars,
    global_steps=st.one_of(st.none(), st.integers(min_value=-(2**62), max_value=2**62)),
    session_id=_scalars,
    project=_scalars,
    experiment_name=_scalars.filter(lambda v: v is not None),
)
def test_json_round_trip_property(**kwargs: Any) -> None:
    identity = SessionIdentity.create(**kwargs)
    assert SessionIdentity.from_dict(json.loads(json.dumps(identity.to_dict()))).to_dict() == identity.to_dict()


def test_from_dict_rejects_a_mismatching_state_lane_id() -> None:
    data = SessionIdentity.create(experiment_name="e", sample=1, session=2).to_dict()
    data["sample"] = "9"
    with pytest.raises(ValueError, match="state_lane_id"):
        SessionIdentity.from_dict(data)


def test_from_dict_rejects_missing_keys() -> None:
    with pytest.raises(ValueError, match="sample"):
        SessionIdentity.from_dict({"experiment_name": "e", "session": "1"})


def test_from_dict_without_state_lane_id_computes_it() -> None:
    identity = SessionIdentity.from_dict({"experiment_name": "e", "sample": "1", "session": "2"})
    assert identity.state_lane_id == "experiment=e/sample=1/session=2/traj=0"


def test_session_uses_config_project_and_experiment(make_bridge: Any) -> None:
    bridge = make_bridge(exporter="memory", project="proj", experiment_name="exp")
    with bridge.session(sample=1, session=2) as defaulted:
        pass
    with bridge.session(sample=1, session=2, project="other", experiment_name="x") as explicit:
        pass
    assert (defaulted.identity.project, defaulted.identity.experiment_name) == ("proj", "exp")
    assert (explicit.identity.project, explicit.identity.experiment_name) == ("other", "x")


def test_session_without_config_project_has_empty_project_and_default_experiment(make_bridge: Any) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.session(sample=1, session=2) as s:
        pass
    assert (s.identity.project, s.identity.experiment_name) == ("", "default")
