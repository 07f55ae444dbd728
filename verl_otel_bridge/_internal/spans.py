"""The spans a bridge hands out around a block or a call, and how an exception is recorded on a span.

:class:`SpanScope` is ``Bridge.span()``'s context manager (:data:`NOOP_SPAN` a disabled
bridge's), :func:`traced_by` the ``traced`` decorator of a bridge and of the module-level
API, :func:`record_error` what every span that ends in an exception gets, :func:`timing_problem`
which times ``record_span`` refuses.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode

from verl_otel_bridge._internal.attributes import AttributeValue, to_text
from verl_otel_bridge._internal.scopes import SpanBlock

F = TypeVar("F", bound=Callable[..., Any])
#: ``start(name, clean_attributes, start_time=None)``: how the bridge starts its own spans.
StartSpan = Callable[..., Span]

#: ``record_span`` times below this (about 11 days after the epoch, in ns) are
#: almost certainly seconds or milliseconds passed by mistake.
_MIN_PLAUSIBLE_TIME_NS = 10**15
_MAX_TIME_NS = 2**64


class Spans(Protocol):
    """What hands out spans by name: a bridge."""

    def span(self, name: str, /, **attributes: Any) -> AbstractContextManager[Span]:
        """A context manager around one span named ``name``."""
        ...


class _NoopSpanContext:
    """What ``span()`` returns when the bridge is disabled: nothing to allocate."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


#: The ``span()`` of a disabled bridge.
NOOP_SPAN = _NoopSpanContext()


class SpanScope:
    """``tracer.start_as_current_span(name, attributes=...)`` as one small class.

    The SDK's version nests two generator-based context managers
    (``start_as_current_span`` and ``use_span``); this does
    the same in two plain method calls: start the span and make it current on
    enter; on exit detach, record an ``Exception`` with status ERROR, and end.
    One scope entered again inside itself makes one span per entry. A forked child
    leaving a block its parent entered does not end the span (the parent does).
    """

    __slots__ = ("_attributes", "_name", "_open", "_start")

    def __init__(self, start: StartSpan, name: str, attributes: Mapping[str, AttributeValue] | None) -> None:
        self._start = start
        self._name = name
        self._attributes = attributes
        self._open: list[tuple[Span, SpanBlock]] = []

    def __enter__(self) -> Span:
        span = self._start(self._name, self._attributes)
        self._open.append((span, SpanBlock(span)))
        return span

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        span, block = self._open.pop()
        if block.inherited:  # a forked child leaving its parent's block: the parent ends the span
            block.close()
            return
        try:
            block.close()
            # As use_span: only an Exception (not GeneratorExit, KeyboardInterrupt, ...) is an error.
            if isinstance(exc, Exception) and span.is_recording():
                record_error(span, exc)
        finally:
            span.end()


def record_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` as an exception event with status ERROR; never raises.

    The SDK's ``record_exception`` calls ``str(exc)``, which can raise: then the event
    is written with the text :func:`~verl_otel_bridge._internal.attributes.to_text` gives.
    """
    message = to_text(exc)
    try:
        span.record_exception(exc)
    except Exception:  # noqa: BLE001 - e.g. an exception whose __str__ raises
        span.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.message": message})
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"))


def traced_by(get_bridge: Callable[[], Spans], name: Any, attributes: Mapping[str, Any]) -> Any:
    """Build a ``traced`` decorator whose bridge is looked up at each call."""

    def decorate(func: F) -> F:
        span_name = name if isinstance(name, str) else func.__qualname__
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with get_bridge().span(span_name, **attributes):
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with get_bridge().span(span_name, **attributes):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    if callable(name):
        return decorate(name)  # used as @traced without parentheses
    return decorate


def timing_problem(start: Any, end: Any) -> str | None:
    """Why ``record_span`` cannot record these times (integer ns since the epoch), None when it can."""
    for value in (start, end):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "times must be integer nanoseconds"
    if start < 0 or end < 0:
        return "negative time"
    if end >= _MAX_TIME_NS:
        return "time beyond what OTLP carries (2**64 ns, the year 2554)"
    if start < _MIN_PLAUSIBLE_TIME_NS:
        return "times look like seconds or milliseconds, not nanoseconds"
    if end < start:
        return "end before start"
    return None
