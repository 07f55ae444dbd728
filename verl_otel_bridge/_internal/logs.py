"""Logging policy: say each problem once, and keep reminding while it lasts."""

from __future__ import annotations

import logging
import threading
import time

from verl_otel_bridge._internal.forks import reinit_after_fork

_MAX_KEYS = 1024


class OnceLogger:
    """Logs a message the first time its key is seen, then stays quiet.

    Keys are bounded (after 1024 distinct keys everything is logged once more
    under a single overflow key) so a stream of unique attribute names cannot
    grow memory.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: set[str] = set()
        self._new_lock()
        reinit_after_fork(self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def log(self, key: str, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` was logged before; True if logged."""
        with self._lock:
            if len(self._seen) >= _MAX_KEYS:
                key = "<overflow>"
            if key in self._seen:
                return False
            self._seen.add(key)
        self.logger.log(level, msg, *args)
        return True


class Reminder:
    """Logs at most once per ``interval_s`` while a condition lasts."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: float | None = None
        self._new_lock()
        reinit_after_fork(self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True (and resets the clock) when the interval has passed since the last reminder."""
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                return False
            self._last = now
            return True
