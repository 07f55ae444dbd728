"""Inspecting spans in tests: a capture object over an ``InMemorySpanExporter``.

Used by the ``otel_spans`` pytest fixture (see :mod:`verl_otel_bridge.pytest_plugin`)
and usable on its own::

    with capture_spans() as spans:
        with verl_otel_bridge.session(sample=0, session=0):
            ...
    spans.one("agent_session")

:func:`generic_span` turns a captured span into what ``exporter: otlp`` sends
(the generic vocabulary Phoenix and MLflow read); :func:`render_tree` draws spans
as an indented tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.current import set_bridge
from verl_otel_bridge._internal.protocol import IDENTITY_KEYS, SESSION_SPAN_NAME
from verl_otel_bridge._internal.tree import render_tree
from verl_otel_bridge._internal.vocabulary import generic_span

__all__ = ["SpanCapture", "capture_spans", "generic_span", "render_tree"]


class SpanCapture:
    """The spans a bridge exported to memory, with helpers to find and check them."""

    def __init__(self, bridge: Bridge) -> None:
        if bridge.memory_exporter is None:
            raise ValueError("SpanCapture needs a bridge whose exporter is 'memory'")
        self.bridge = bridge
        self.exporter = bridge.memory_exporter

    @property
    def spans(self) -> list[ReadableSpan]:
        """Every finished span so far, in the order they ended."""
        self.bridge.force_flush(10)
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        """The finished spans called ``name``."""
        return [span for span in self.spans if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        """The single span called ``name``; fails the test if there are none or several."""
        found = self.by_name(name)
        if len(found) != 1:
            raise AssertionError(f"expected exactly one span named {name!r}, found {len(found)}; spans:\n{self.tree()}")
        return found[0]

    def sessions(self) -> list[ReadableSpan]:
        """The ``agent_session`` spans."""
        return self.by_name(SESSION_SPAN_NAME)

    def tree(self) -> str:
        """The captured spans as an indented text tree."""
        return render_tree(self.spans)

    def clear(self) -> None:
        """Forget the spans captured so far."""
        self.bridge.force_flush(10)
        self.exporter.clear()

    def assert_identity(self, span: ReadableSpan, expected: Mapping[str, Any] | None = None) -> None:
        """Fail with a readable diff if ``span`` lacks an identity key or has a different value."""
        attributes = dict(span.attributes or {})
        problems = [f"  missing {key!r}" for key in IDENTITY_KEYS if key not in attributes]
        for key, value in (expected or {}).items():
            if key in attributes and attributes[key] != value:
                problems.append(f"  {key!r}: expected {value!r}, got {attributes[key]!r}")
        if problems:
            raise AssertionError(f"span {span.name!r} identity differs:\n" + "\n".join(problems))


@contextmanager
def capture_spans(**overrides: Any) -> Iterator[SpanCapture]:
    """Install a fresh in-memory bridge as the current one for the block, then restore the previous."""
    settings: dict[str, Any] = {"exporter": "memory", "memory_max_spans": 100_000}
    settings.update(overrides)
    bridge = Bridge(BridgeConfig.resolve(environ={}, **settings))
    previous = set_bridge(bridge)
    try:
        yield SpanCapture(bridge)
    finally:
        set_bridge(previous)
        bridge.shutdown()
