"""Making a span current for a block, so that leaving blocks out of order leaves no stale span current.

OpenTelemetry's ``attach``/``detach`` restore the context a token was made in:
leave two blocks in entry order and the second ``detach`` puts the first, already
ended span back as the parent of everything after it in that thread. Each block
here records the context it was entered in; leaving it closes it, and restoring
skips closed blocks, so the context after the last block is the one before the
first.

After ``os.fork()`` the child goes on with the blocks open in the forking thread,
but their spans are the parent's, which ends (and exports) them: the child marks
those blocks :attr:`SpanBlock.inherited`, and leaving one there only restores the
context, without ending its span.
"""

from __future__ import annotations

import os
import warnings

from opentelemetry import context as otel_context
from opentelemetry.trace import INVALID_SPAN, Span, set_span_in_context

_KEY = otel_context.create_key("verl_otel_bridge.scope")
#: The context key OpenTelemetry keeps the current span under, read once through its public API.
_SPAN_KEY = next(iter(set_span_in_context(INVALID_SPAN, otel_context.Context())))


class SpanBlock:
    """One block during which ``span`` is current.

    Attributes:
        inherited: the block was open in the thread that forked this process: its
            span is the parent process's to end.
    """

    __slots__ = ("context", "inherited", "open", "previous")

    def __init__(self, span: Span) -> None:
        self.previous = otel_context.get_current()
        self.open = True
        self.inherited = False
        # One copy of the context, where set_span_in_context and set_value would make two.
        self.context = otel_context.Context({**self.previous, _SPAN_KEY: span, _KEY: self})
        otel_context.attach(self.context)

    def close(self) -> None:
        """Leave the block: restore the context it was entered in, past any block already closed.

        Not the current block (left out of order, or from another context): only
        closed, so the block that is current restores past it when it closes.
        """
        self.open = False
        if otel_context.get_current() is not self.context:
            note_repair()
            return
        target = self.previous
        block = target.get(_KEY)
        while isinstance(block, SpanBlock) and not block.open:
            target = block.previous
            block = target.get(_KEY)
        # attach, not detach(token): a token made in another context (an async generator
        # finalised by another task) cannot be reset there, and the target is known.
        otel_context.attach(target)


def _inherit_open_blocks() -> None:
    """In a forked child: mark the blocks open in the forking thread (its only thread now) as the parent's.

    The blocks of other threads never close in the child (those threads do not exist there).
    """
    block = otel_context.get_current().get(_KEY)
    while isinstance(block, SpanBlock):
        block.inherited = True
        block = block.previous.get(_KEY)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_inherit_open_blocks)


def note_repair() -> None:
    """Say (once per place, as Python's warnings do) that a block was left out of order."""
    warnings.warn(
        "verl_otel_bridge: a session, span or resume() block was left out of order or from another context; "
        "it is no longer current (closed blocks are skipped)",
        RuntimeWarning,
        stacklevel=4,
    )
