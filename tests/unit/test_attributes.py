"""Attribute values are converted to what OpenTelemetry keeps, never dropped, never raising."""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.attributes import TRUNCATION_MARKER, clean_attributes
from verl_otel_bridge.testing import SpanCapture


class Scalar:
    """Like a numpy scalar: ``.item()`` and ``ndim == 0``."""

    ndim = 0

    def __init__(self, value: Any) -> None:
        self.value = value

    def item(self) -> Any:
        return self.value


class Array:
    """Like a numpy array: ``.tolist()``."""

    ndim = 1

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def tolist(self) -> list[Any]:
        return self.values

    def item(self) -> Any:
        raise ValueError("only size-1 arrays")


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        return "<BadStr>"


class Color(enum.IntEnum):
    RED = 1


class Tool:
    def __str__(self) -> str:
        return "Tool(search)"


CONVERSIONS: list[tuple[str, Any, Any]] = [
    ("str", "text", "text"),
    ("int", 3, 3),
    ("float", 2.5, 2.5),
    ("bool", True, True),
    ("dict", {"b": 1, "a": [1, "x"]}, json.dumps({"b": 1, "a": [1, "x"]})),
    ("nested_dict_with_object", {"tool": Tool()}, '{"tool": "Tool(search)"}'),
    ("mixed_list", [1, "a", None], '[1, "a", null]'),
    ("list_of_dicts", [{"a": 1}], ('{"a": 1}',)),
    ("homogeneous_str_list", ["a", "b"], ("a", "b")),
    ("homogeneous_int_tuple", (1, 2, 3), (1, 2, 3)),
    ("bool_list", [True, False], (True, False)),
    ("int_float_list", [1, 2.5], (1.0, 2.5)),
    ("bool_int_list", [True, 1], "[true, 1]"),
    ("empty_list", [], ()),
    ("bytes", b"caf\xc3\xa9", "café"),
    ("invalid_bytes", b"\xff", "\ufffd"),
    ("bytearray", bytearray(b"ab"), "ab"),
    ("item_int", Scalar(7), 7),
    ("item_float", Scalar(0.5), 0.5),
    ("item_bool", Scalar(True), True),
    ("array", Array([1, 2]), (1, 2)),
    ("int_enum", Color.RED, 1),
    ("set", {"b", "a"}, '["a", "b"]'),
    ("object", Tool(), "Tool(search)"),
    ("str_raises", BadStr(), "<BadStr>"),
]


@pytest.mark.parametrize(("key", "value", "expected"), CONVERSIONS, ids=[c[0] for c in CONVERSIONS])
def test_span_attribute_conversion(otel_spans: SpanCapture, key: str, value: Any, expected: Any) -> None:
    with otel_spans.bridge.span("s", **{key: value}):
        pass
    attributes = dict(otel_spans.one("s").attributes or {})
    assert attributes[key] == expected
    assert type(attributes[key]) is type(expected)


def test_none_is_left_out(otel_spans: SpanCapture) -> None:
    with otel_spans.bridge.span("s", gone=None, kept=0):
        pass
    assert dict(otel_spans.one("s").attributes or {}) == {"kept": 0}


def test_conversions_are_counted_and_logged_once_per_key(
    otel_spans: SpanCapture, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    for _ in range(5):
        with otel_spans.bridge.span("s", payload={"a": 1}, mixed=[1, "x"]):
            pass
    assert otel_spans.bridge.status()["counters"]["converted"] == 10
    assert sum("'payload'" in r.getMessage() for r in caplog.records) == 1
    assert sum("'mixed'" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("value", "full_text"),
    [
        ("x" * 50, "x" * 50),
        (["x" * 50, "y"], "x" * 50),  # each item of a sequence
        ({"k": "x" * 50}, json.dumps({"k": "x" * 50})),
        (b"x" * 50, "x" * 50),
        (Scalar("x" * 50), "x" * 50),
    ],
)
def test_long_values_are_truncated_with_a_marker(
    make_bridge: Callable[..., Bridge], value: Any, full_text: str
) -> None:
    bridge = make_bridge(exporter="memory", max_attribute_length=10)
    with bridge.span("s", v=value):
        pass
    (span,) = bridge.memory_exporter.get_finished_spans()
    converted = span.attributes["v"]
    text = converted[0] if isinstance(converted, tuple) else converted
    assert text == full_text[:10] + TRUNCATION_MARKER.format(len(full_text) - 10)
    assert bridge.status()["counters"]["converted"] >= 1


def test_string_at_the_limit_is_kept_whole(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", max_attribute_length=10)
    with bridge.span("s", v="x" * 10):
        pass
    assert bridge.memory_exporter.get_finished_spans()[0].attributes["v"] == "x" * 10


def test_record_span_with_non_string_keys(otel_spans: SpanCapture) -> None:
    otel_spans.bridge.record_span(
        "r",
        start_time_ns=1_700_000_000_000_000_000,
        end_time_ns=1_700_000_000_000_000_001,
        attributes={1: "one", ("a", 2): [1, 2], None: "none", BadStr(): {"x": 1}},
    )
    assert dict(otel_spans.one("r").attributes or {}) == {
        "1": "one",
        "('a', 2)": (1, 2),
        "None": "none",
        "<BadStr>": '{"x": 1}',
    }


def test_clean_attributes_never_raises_on_hostile_values() -> None:
    class Hostile:
        ndim = 0

        def item(self) -> Any:
            raise RuntimeError("item")

        def __str__(self) -> str:
            raise RuntimeError("str")

        def __repr__(self) -> str:
            raise RuntimeError("repr")

    cleaned = clean_attributes({"h": Hostile(), "l": [Hostile()], "d": {"h": Hostile()}})
    assert set(cleaned) == {"h", "l", "d"}
    assert all(isinstance(v, (str, tuple)) for v in cleaned.values())


def test_span_with_empty_or_non_string_name(otel_spans: SpanCapture) -> None:
    with otel_spans.bridge.span(""):
        pass
    with otel_spans.bridge.span(None):  # type: ignore[arg-type]
        pass
    with otel_spans.bridge.span(42):  # type: ignore[arg-type]
        pass
    assert sorted(span.name for span in otel_spans.spans) == ["42", "unnamed", "unnamed"]
