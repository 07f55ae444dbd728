"""docs/reliability.md, "Bad input at span time": one test per row of the table.

Each test feeds the bridge what the row names, and checks what a user relies on:
nothing raises into the caller, the exporter receives exactly what the row says,
each kind of problem is logged once and names the attribute, ``converted`` and
``invalid`` count what happened, and after a flush every ended span is in exactly
one accounting bucket (``balance(...) == 0``).
"""

from __future__ import annotations

import json
import logging
import math
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge import Bridge, SessionIdentity
from verl_otel_bridge._internal.attributes import TRUNCATION_MARKER
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

from .helpers import T0, assert_balanced, finished, identity_of

REPEAT = 3  # every bad input is sent this often: the log line must still appear once


# -- fakes -----------------------------------------------------------------------


class FakeNumpyScalar:
    """What ``numpy.float32(0.5)`` looks like to the bridge: ``.item()``, ``.tolist()``, ``ndim == 0``.

    Deliberately *not* a ``float`` subclass (``numpy.float32`` is not), and not
    something OpenTelemetry would accept as it is.
    """

    ndim = 0

    def __init__(self, value: Any) -> None:
        self.value = value

    def item(self) -> Any:
        return self.value

    def tolist(self) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"np.scalar({self.value!r})"


class FakeNumpyArray:
    """What a numpy array looks like: ``.tolist()``, ``ndim >= 1``, and an ``.item()`` that raises."""

    def __init__(self, values: list[Any], ndim: int = 1) -> None:
        self.values = values
        self.ndim = ndim

    def item(self) -> Any:
        raise ValueError("can only convert an array of size 1 to a Python scalar")

    def tolist(self) -> list[Any]:
        return self.values

    def __repr__(self) -> str:
        return f"array({self.values!r})"


class StrRaises:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        return "<StrRaises repr>"


class NothingPrints:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class ConfigLike(Mapping[str, Any]):
    """A mapping that is not a dict (OmegaConf's ``DictConfig``, ``MappingProxyType`` ...)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ConfigLike({self._data!r})"


class ExplodingMapping(Mapping[str, Any]):
    """An identity "dict" whose reads raise (e.g. an OmegaConf node with a broken interpolation)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError(f"cannot resolve ${{{key}}}")

    def __iter__(self) -> Iterator[str]:
        return iter(("experiment_name", "sample", "session"))

    def __len__(self) -> int:
        return 3


# -- helpers -----------------------------------------------------------------------


@pytest.fixture
def bridge(make_bridge: Callable[..., Bridge]) -> Bridge:
    """An in-memory bridge with the default limits (``max_attribute_length`` 32,768)."""
    return make_bridge(exporter="memory")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    return caplog


def spans_named(bridge: Bridge, name: str) -> list[ReadableSpan]:
    return [span for span in finished(bridge) if span.name == name]


def send(bridge: Bridge, attributes: dict[str, Any], times: int = REPEAT) -> dict[str, Any]:
    """End ``times`` spans named ``s`` with ``attributes``; return what the exporter got (all the same)."""
    for _ in range(times):
        with bridge.span("s", **attributes):
            pass
    exported = [dict(span.attributes or {}) for span in spans_named(bridge, "s")]
    assert len(exported) == times
    assert all(e == exported[0] or _nan_equal(e, exported[0]) for e in exported)
    return exported[0]


def _nan_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def messages_naming(logs: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [r for r in logs.records if repr(key) in r.getMessage()]


def assert_logged_once_per_key(logs: pytest.LogCaptureFixture, keys: list[str], level: int) -> None:
    for key in keys:
        records = messages_naming(logs, key)
        assert len(records) == 1, (key, [r.getMessage() for r in logs.records])
        assert records[0].levelno == level, (key, records[0].levelname)


def counters(bridge: Bridge) -> dict[str, Any]:
    """The counters after a flush, having checked that every ended span is accounted for."""
    return assert_balanced(bridge)


def assert_exact_types(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got == expected
    for key, value in expected.items():
        assert type(got[key]) is type(value), (key, got[key], value)


def assert_converted(
    bridge: Bridge, logs: pytest.LogCaptureFixture, got: dict[str, Any], expected: dict[str, Any], level: int
) -> None:
    """``got`` is ``expected`` (types too); each key was converted on every span and logged once, at ``level``."""
    assert_exact_types(got, expected)
    assert_logged_once_per_key(logs, list(expected), level)
    assert counters(bridge)["converted"] == len(expected) * REPEAT


# -- the table, row by row ---------------------------------------------------------


def test_mapping_becomes_a_json_string(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(
        bridge,
        {
            "plain_dict": {"b": 1, "a": [1, "x"], "n": None},
            "proxy": types.MappingProxyType({"k": 1}),
            "config_like": ConfigLike({"lr": 0.1, "nested": ConfigLike({"x": True})}),
            "tuple_keys": {("a", 1): 1, 2: "two"},
        },
    )
    expected = {
        "plain_dict": '{"b": 1, "a": [1, "x"], "n": null}',
        "proxy": '{"k": 1}',
        "config_like": '{"lr": 0.1, "nested": {"x": true}}',
        "tuple_keys": '{"(\'a\', 1)": 1, "2": "two"}',
    }
    assert_converted(bridge, logs, got, expected, logging.INFO)


def test_list_or_tuple_of_one_primitive_type_is_kept_as_an_array(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    got = send(
        bridge, {"strs": ["a", "b"], "ints": (1, 2, 3), "floats": [0.5, 1.5], "bools": [True, False], "empty": []}
    )
    assert_exact_types(
        got, {"strs": ("a", "b"), "ints": (1, 2, 3), "floats": (0.5, 1.5), "bools": (True, False), "empty": ()}
    )
    assert [type(v) for v in got["ints"]] == [int, int, int]
    assert logs.records == []
    assert counters(bridge)["converted"] == 0


def test_mixed_list_tuple_or_set_becomes_a_json_string(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(
        bridge,
        {
            "mixed_list": [1, "a", None],
            "mixed_tuple": (1, "a"),
            "bool_and_int": [True, 1],
            "a_set": {"b", "a"},
            "a_frozenset": frozenset({2, 1}),
        },
    )
    expected = {
        "mixed_list": '[1, "a", null]',
        "mixed_tuple": '[1, "a"]',
        "bool_and_int": "[true, 1]",
        "a_set": '["a", "b"]',
        "a_frozenset": "[1, 2]",
    }
    assert_converted(bridge, logs, got, expected, logging.WARNING)


def test_none_leaves_the_key_out(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(bridge, {"gone": None, "kept": 0})
    assert got == {"kept": 0}
    with bridge.session(sample=0, session=0) as session:
        with session.task("t") as task:
            task.set_result(status=None, reward=None, error=None)
    assert "status" not in (spans_named(bridge, "agent_task")[0].attributes or {})
    assert logs.records == []
    assert counters(bridge)["converted"] == 0


def test_bytes_become_utf8_text_with_invalid_bytes_replaced(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(
        bridge,
        {"utf8": "café".encode(), "invalid": b"ok\xff\xfe", "ba": bytearray(b"ab"), "mv": memoryview(b"cd")},
    )
    assert_converted(
        bridge, logs, got, {"utf8": "café", "invalid": "ok\ufffd\ufffd", "ba": "ab", "mv": "cd"}, logging.INFO
    )


def test_numpy_like_scalars_and_item_objects_become_python_scalars(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    got = send(
        bridge,
        {
            "reward": FakeNumpyScalar(0.5),
            "tokens": FakeNumpyScalar(7),
            "done": FakeNumpyScalar(True),
            "label": FakeNumpyScalar("ok"),
        },
    )
    assert_converted(bridge, logs, got, {"reward": 0.5, "tokens": 7, "done": True, "label": "ok"}, logging.WARNING)


def test_numpy_like_arrays_convert_like_lists(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(
        bridge,
        {
            "ids": FakeNumpyArray([1, 2, 3]),
            "probs": FakeNumpyArray([0.25, 0.75]),
            "matrix": FakeNumpyArray([[1, 2], [3, 4]], ndim=2),
            "mixed": FakeNumpyArray([1, "a"]),
        },
    )
    assert_exact_types(
        got, {"ids": (1, 2, 3), "probs": (0.25, 0.75), "matrix": "[[1, 2], [3, 4]]", "mixed": '[1, "a"]'}
    )
    assert_logged_once_per_key(logs, ["ids", "probs", "matrix", "mixed"], logging.WARNING)
    assert counters(bridge)["converted"] >= 4 * REPEAT


def test_real_numpy_scalars_and_arrays(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    np = pytest.importorskip("numpy")
    got = send(
        bridge,
        {
            "f32": np.float32(0.5),
            "f64": np.float64(0.25),
            "i64": np.int64(7),
            "b": np.bool_(True),
            "zero_d": np.array(2.5),
            "ids": np.array([1, 2, 3]),
            "names": np.array(["a", "b"]),
            "matrix": np.array([[1, 2], [3, 4]]),
        },
    )
    assert_exact_types(
        got,
        {
            "f32": 0.5,
            "f64": 0.25,
            "i64": 7,
            "b": True,
            "zero_d": 2.5,
            "ids": (1, 2, 3),
            "names": ("a", "b"),
            "matrix": "[[1, 2], [3, 4]]",
        },
    )
    assert [type(v) for v in got["ids"]] == [int, int, int]
    assert_logged_once_per_key(logs, ["f32", "i64", "b", "zero_d", "ids", "names", "matrix"], logging.WARNING)
    assert counters(bridge)["converted"] >= 7 * REPEAT


def test_object_whose_str_raises_becomes_its_repr_or_unprintable(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    got = send(bridge, {"tool": StrRaises(), "weird": NothingPrints()})
    assert_converted(
        bridge, logs, got, {"tool": "<StrRaises repr>", "weird": "<unprintable NothingPrints>"}, logging.WARNING
    )


def test_nan_and_infinities_are_kept(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    got = send(bridge, {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "arr": [math.nan, math.inf]})
    assert math.isnan(got["nan"]) and got["inf"] == math.inf and got["ninf"] == -math.inf
    assert math.isnan(got["arr"][0]) and got["arr"][1] == math.inf and len(got["arr"]) == 2
    assert logs.records == []
    assert counters(bridge)["converted"] == 0


def test_ten_megabyte_string_is_cut_with_the_marker(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    limit = bridge.config.max_attribute_length
    assert limit == 32_768  # the documented default
    huge = "x" * (10 * 1024 * 1024)
    got = send(bridge, {"content": huge, "short": "y" * limit})
    cut = len(huge) - limit
    assert got["content"] == "x" * limit + TRUNCATION_MARKER.format(cut)
    assert got["content"].endswith(f"...[truncated {cut} chars]")
    assert got["short"] == "y" * limit  # at the limit: whole
    assert_logged_once_per_key(logs, ["content"], logging.WARNING)
    assert messages_naming(logs, "short") == []
    assert counters(bridge)["converted"] == REPEAT


def test_non_string_attribute_keys_become_str_of_the_key(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    attributes: dict[Any, Any] = {1: "one", ("a", 2): "pair", None: "none", StrRaises(): "odd", "fine": 1}
    for i in range(REPEAT):
        bridge.record_span("r", start_time_ns=T0 + i, end_time_ns=T0 + i + 10, attributes=attributes)
    spans = spans_named(bridge, "r")
    assert len(spans) == REPEAT
    for span in spans:
        assert dict(span.attributes or {}) == {
            "1": "one",
            "('a', 2)": "pair",
            "None": "none",
            "<StrRaises repr>": "odd",
            "fine": 1,
        }
    assert_logged_once_per_key(logs, ["1", "('a', 2)", "None", "<StrRaises repr>"], logging.WARNING)
    assert counters(bridge)["converted"] == 4 * REPEAT


@pytest.mark.parametrize("name", [None, ""])
def test_empty_or_none_span_name_is_recorded_as_unnamed(
    bridge: Bridge, logs: pytest.LogCaptureFixture, name: Any
) -> None:
    for i in range(REPEAT):
        with bridge.span(name, i=i):
            pass
        bridge.record_span(name, start_time_ns=T0, end_time_ns=T0 + 1)
    assert [span.name for span in finished(bridge)] == ["unnamed"] * (2 * REPEAT)
    records = [r for r in logs.records if "unnamed" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert counters(bridge)["ended"] == 2 * REPEAT


def test_identity_values_with_slashes_newlines_and_non_ascii_are_kept_verbatim(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    given = {
        "experiment_name": "实验/1",
        "sample": "a/b",
        "session": "line1\nline2",
        "traj": "τ",
        "uid": "ü\u0000",
        "session_id": "id/with\r\nbreak",
        "project": "prøject",
    }
    with bridge.session(**given) as session:
        with bridge.span("child"):
            pass
    expected_lane = "experiment=实验/1/sample=a/b/session=line1\nline2/traj=τ"
    assert session.identity.state_lane_id == expected_lane
    for span in finished(bridge):
        identity = identity_of(span)
        assert identity["state_lane_id"] == expected_lane
        for key, value in given.items():
            assert identity[key] == value, key
    assert SessionIdentity.from_dict(json.loads(json.dumps(session.identity.to_dict()))) == session.identity
    assert [r for r in logs.records if r.levelno >= logging.WARNING] == []
    assert counters(bridge)["converted"] == 0


def test_turn_that_is_not_an_integer_is_kept_as_text_with_one_warning(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    with bridge.session(sample=0, session=0):
        for _ in range(REPEAT):
            with bridge.turn("first"):  # type: ignore[arg-type]
                pass
        with bridge.turn("2"):  # type: ignore[arg-type]
            pass
        with bridge.turn(3):
            pass
    turns = [span.attributes["turn"] for span in spans_named(bridge, "agent_turn")]
    assert turns == ["first"] * REPEAT + [2, 3]
    assert type(turns[-2]) is int
    records = [r for r in logs.records if "turn" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING, [r.getMessage() for r in records]
    assert "'first'" in records[0].getMessage()
    assert counters(bridge)["converted"] == REPEAT


MALFORMED_IDENTITIES: list[Any] = [
    {},
    {"sample": 1},  # lacks experiment_name and session
    {"experiment_name": "e", "sample": 1, "session": 2, "state_lane_id": "experiment=other/sample=1/session=2/traj=0"},
    None,
    42,
    ["experiment_name", "sample", "session"],
    "experiment=e/sample=1/session=2/traj=0",
    ExplodingMapping(),
]


def test_resume_with_a_malformed_identity_runs_the_block_without_identity(
    bridge: Bridge, logs: pytest.LogCaptureFixture
) -> None:
    ran = 0
    with bridge.session(sample=9, session=9, experiment_name="outer") as outer:
        for bad in MALFORMED_IDENTITIES:
            with bridge.resume(bad) as identity:
                assert identity is None
                with bridge.span("inside"):
                    ran += 1
        with bridge.span("after"):  # the session's identity is back
            pass
    assert ran == len(MALFORMED_IDENTITIES)
    inside = spans_named(bridge, "inside")
    assert len(inside) == len(MALFORMED_IDENTITIES)
    assert all(not set(IDENTITY_KEYS) & set(span.attributes or {}) for span in inside)
    assert identity_of(spans_named(bridge, "after")[0]) == outer.identity.to_dict()
    records = [r for r in logs.records if "resume" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING, [r.getMessage() for r in records]
    assert counters(bridge)["ended"] == len(MALFORMED_IDENTITIES) + 2


# -- the guarantee behind the table: the spans' own methods do not raise either -----


def test_handle_methods_convert_instead_of_raising(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    with bridge.session(sample=0, session=0) as session:
        with session.task("t") as task:
            task.set_result(
                status=StrRaises(),
                reward=FakeNumpyScalar(0.5),
                accuracy=math.nan,  # type: ignore[arg-type]
                error=ValueError(NothingPrints()),
                finished=FakeNumpyScalar(True),
            )  # type: ignore[arg-type]
        with session.turn(0) as turn:
            turn.record(
                finish_reason=FakeNumpyScalar("stop"),  # type: ignore[arg-type]
                prompt_tokens=FakeNumpyScalar(12),  # type: ignore[arg-type]
                tools=[StrRaises(), "search"],  # type: ignore[list-item]
                tool_args={("q", 1): FakeNumpyScalar(2), "raw": b"\xff"},  # type: ignore[dict-item]
                content="x" * 40_000,
                reasoning=b"bytes",  # type: ignore[arg-type]
            )
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        with session.turn(1) as turn:
            turn.record(tools=5, tool_args=cyclic)  # type: ignore[arg-type]
        session.finish(status=StrRaises(), trajectories=[{"chain_id": object(), "reward_score": math.inf}])  # type: ignore[arg-type]
    task_span = spans_named(bridge, "agent_task")[0].attributes or {}
    assert task_span["status"] == "<StrRaises repr>"
    assert task_span["reward"] == 0.5 and task_span["finished"] is True
    assert task_span["error"].startswith("ValueError: ")
    turn_span, second = (span.attributes or {} for span in spans_named(bridge, "agent_turn"))
    assert turn_span["finish_reason"] == "stop" and turn_span["prompt_tokens"] == 12
    assert turn_span["tools"] == "<StrRaises repr>,search"
    assert json.loads(turn_span["tool_args"]).keys() == {"('q', 1)", "raw"}
    assert turn_span["content"].endswith(TRUNCATION_MARKER.format(40_000 - 32_768))
    assert turn_span["reasoning"] == "bytes"
    assert second["tools"] == "5" and second["tool_args"] == "{'self': {...}}"
    session_span = spans_named(bridge, "agent_session")[0].attributes or {}
    assert session_span["status"] == "<StrRaises repr>"
    assert counters(bridge)["ended"] == 4
