"""pytest plugin (entry point ``pytest11``): the ``otel_spans`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from verl_otel_bridge.testing import SpanCapture, capture_spans


@pytest.fixture
def otel_spans() -> Iterator[SpanCapture]:
    """A fresh in-memory bridge, current for the test: ``otel_spans.one("agent_session")``."""
    with capture_spans() as capture:
        yield capture
