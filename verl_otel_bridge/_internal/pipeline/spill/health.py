"""Whether the destination answers, as the spilling exporter and the drain see it."""

from __future__ import annotations

import time


class Health:
    """Whether the destination answers: up, failing (since when), or down (failing longer than ``after_s``)."""

    def __init__(self, after_s: float, probe_s: float) -> None:
        self._after_s = after_s
        self._probe_s = probe_s
        self._failing_since: float | None = None
        self._last_try = 0.0

    @property
    def up(self) -> bool:
        """The last batch tried was accepted."""
        return self._failing_since is None

    def should_try(self) -> bool:
        """Whether the export thread sends a batch: unless the destination is down (then only the drain tries)."""
        since = self._failing_since
        return since is None or time.monotonic() - since < self._after_s

    def retry_due(self) -> bool:
        """Whether ``probe_s`` has passed since the last batch was tried (the drain waits for it while failing)."""
        return time.monotonic() - self._last_try >= self._probe_s

    def succeeded(self) -> None:
        """The destination accepted a batch."""
        self._failing_since = None

    def failed(self) -> None:
        """The destination refused a batch."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._last_try = now
