"""``watch``'s loop: read what the captures gained, redraw about once per interval, until interrupted.

On a terminal the screen is redrawn in place (``rich``'s ``Live``, the ``cli``
extra); elsewhere (a pipe, a log file) one plain line per interval. Ctrl-C and
SIGTERM end the loop; the caller turns that into the exit code.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from verl_otel_bridge._internal.watch.follow import Follower
from verl_otel_bridge._internal.watch.live import LiveView, Snapshot
from verl_otel_bridge._internal.watch.screen import plain_line, renderables


def catch_up(follower: Follower, view: LiveView, budget_s: float = float("inf")) -> None:
    """Feed ``view`` what the files gained, until nothing is left unread or ``budget_s`` has passed."""
    deadline = time.monotonic() + budget_s
    while True:
        for found in follower.poll():
            view.feed(found)
        view.mark_broken(follower.broken)
        if not follower.behind or time.monotonic() >= deadline:
            return


def snapshot_now(view: LiveView) -> Snapshot:
    """The view as of this moment."""
    return view.snapshot(time.time_ns())


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the loop as Ctrl-C does (only where signals can be handled: the main thread)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous: Any = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(console: Any, follower: Follower, view: LiveView, *, title: str, interval_s: float) -> None:
    """Follow and show until Ctrl-C or SIGTERM (which return normally)."""
    try:
        with _sigterm_interrupts():
            if console.is_terminal:
                _live(console, follower, view, title=title, interval_s=interval_s)
            else:
                _plain(console, follower, view, interval_s=interval_s)
    except KeyboardInterrupt:
        return


def _live(console: Any, follower: Follower, view: LiveView, *, title: str, interval_s: float) -> None:
    from rich.console import Group
    from rich.live import Live

    with Live(console=console, auto_refresh=False, vertical_overflow="crop", redirect_stderr=False) as live:
        while True:
            started = time.monotonic()
            catch_up(follower, view, interval_s)
            live.update(Group(*renderables(snapshot_now(view), title)), refresh=True)
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def _plain(console: Any, follower: Follower, view: LiveView, *, interval_s: float) -> None:
    from rich.text import Text

    while True:
        started = time.monotonic()
        catch_up(follower, view, interval_s)
        console.print(Text(plain_line(snapshot_now(view))), soft_wrap=True)
        console.file.flush()  # a pipe is block-buffered: each line goes out when it is made
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
