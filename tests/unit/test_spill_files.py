"""The spill's files: private to the user, never redirected, and drained whatever happens to them."""

from __future__ import annotations

import itertools
import json
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import default_spill_dir
from verl_otel_bridge._internal.pipeline.spill import FROM_QUEUE, Spill, SpillSettings
from verl_otel_bridge._internal.pipeline.spill import segments as spill_segments
from verl_otel_bridge._internal.records import record_to_span

from .helpers import wait_until, waits_while_idle
from .test_private_files import NOBODY, as_root


def span(n: int, payload: str = "") -> ReadableSpan:
    return record_to_span(
        {
            "name": "s",
            "trace_id": f"{n + 1:032x}",
            "span_id": f"{n + 1:016x}",
            "start_time_ns": 1,
            "end_time_ns": 2,
            "attributes": {"n": n, "payload": payload},
        }
    )


class Held:
    """A spill whose drain waits until :meth:`release` (the destination "fails" until then)."""

    def __init__(self, directory: Path) -> None:
        self.counts = SpanCounts()
        settings = SpillSettings(
            spill_dir=str(directory),
            spill_max_bytes=10_000_000,
            buffer_bytes=1 << 20,
            max_export_batch_size=50,
            spill_after_s=0.0,
            spill_probe_s=3600.0,
        )
        self.up = threading.Event()  # the destination "fails" until released
        self.received: list[int] = []
        self.spill = Spill(settings, self.counts, {FROM_QUEUE: self._deliver}, self.up.is_set)

    def _deliver(self, spans: list[ReadableSpan]) -> None:
        self.received.extend(int(s.attributes["n"]) for s in spans)  # type: ignore[arg-type, index]
        self.counts.add("exported.test", len(spans))

    def write(self, count: int, payload: str = "") -> list[Path]:
        assert self.spill.write([span(n, payload) for n in range(count)], FROM_QUEUE)
        return [Path(f) for f in self.spill.status()["files"]]

    def release(self) -> None:
        self.up.set()
        self.spill.wake_drain()

    def drained(self) -> dict[str, object]:
        wait_until(
            lambda: self.counts.snapshot()["spilled"] == 0 and not self.spill.status()["backlog"],
            what="the spill drained",
        )
        return self.counts.snapshot()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    made = Held(tmp_path / "spill")
    yield made
    made.spill.shutdown(5.0)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- private ----------------------------------------------------------------------


def test_the_default_directory_is_one_per_user() -> None:
    assert default_spill_dir().endswith(f"verl_otel_bridge_spill-{os.geteuid()}")


def test_the_directory_is_made_0700_and_files_0600(held: Held, tmp_path: Path) -> None:
    files = held.write(3)
    assert mode(tmp_path / "spill") == 0o700
    assert files and all(mode(f) == 0o600 for f in files)


def _refused(tmp_path: Path, directory: Path, caplog: pytest.LogCaptureFixture) -> None:
    counts = SpanCounts()
    settings = SpillSettings(str(directory), 10_000_000, 1 << 20, 50, 60.0, 5.0)
    spill = Spill(settings, counts, {})
    try:
        with caplog.at_level(logging.WARNING):
            assert not spill.write([span(1), span(2)], FROM_QUEUE)
        assert counts.snapshot()["dropped"] == 2 and counts.snapshot()["spilled"] == 0
        warned = [r.getMessage() for r in caplog.records if "refusing to spill into" in r.getMessage()]
        assert len(warned) == 1 and str(directory) in warned[0], warned
        assert spill.status()["files"] == []
    finally:
        spill.shutdown(5.0)


def test_an_existing_directory_open_to_others_is_refused_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _refused(tmp_path, shared, caplog)
    assert list(shared.iterdir()) == [] and mode(shared) == 0o777


@as_root
def test_a_directory_another_user_made_first_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    _refused(tmp_path, theirs, caplog)
    assert list(theirs.iterdir()) == []


def test_a_symlink_planted_as_the_directory_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "spill-link").symlink_to(elsewhere)
    _refused(tmp_path, tmp_path / "spill-link", caplog)
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_planted_under_a_segment_name_is_never_followed(
    held: Held, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setattr(spill_segments, "_SEGMENT_NUMBERS", itertools.count(1000))
    directory = tmp_path / "spill"
    directory.mkdir(mode=0o700)
    prefix = f"spill-{os.uname().nodename}-{os.getpid()}"
    for n in range(1000, 1003):
        (directory / f"{prefix}-{n}.jsonl").symlink_to(victim)
    files = held.write(5)
    assert victim.read_text() == "precious\n"
    assert [f.name for f in files] == [f"{prefix}-1003.jsonl"]
    held.release()
    assert held.drained()["failed"] == 0 and sorted(held.received) == list(range(5))


# -- drained whatever happens to the files ------------------------------------------


def test_a_removed_file_is_still_drained_whole(held: Held) -> None:
    for path in held.write(120):
        path.unlink()
    held.release()
    counters = held.drained()
    assert (counters["failed"], sorted(held.received)) == (0, list(range(120)))


def test_a_truncated_file_counts_the_lost_spans_failed_and_the_drain_goes_idle(held: Held) -> None:
    (path,) = held.write(100)
    lines = path.read_bytes().splitlines(keepends=True)
    os.truncate(path, sum(len(line) for line in lines[:30]) + 7)  # 30 whole lines and part of one
    held.release()
    counters = held.drained()
    assert sorted(held.received) == list(range(30))
    assert counters["failed"] == 70 and counters["exported"] == {"test": 30}
    assert not path.exists()
    assert held.spill._drain is not None
    assert waits_while_idle(held.spill._drain) == 1  # nothing left: the drain waits, it does not spin


@pytest.mark.parametrize(
    "garbage",
    [b"[" * 100_000, b"not json", b"\xff\xfe", b'{"name": 1}', b"\x00" * 50, json.dumps([1, 2]).encode()],
    ids=["deep", "text", "bytes", "record", "zeros", "array"],
)
def test_corrupt_lines_are_counted_failed_and_the_rest_are_sent(held: Held, garbage: bytes) -> None:
    (path,) = held.write(10, payload="x" * 110_000)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = garbage[: len(lines[3]) - 1].ljust(len(lines[3]) - 1) + b"\n"  # the same size, so the rest stays put
    with path.open("r+b") as stream:
        stream.write(b"".join(lines))
    held.release()
    counters = held.drained()
    assert counters["failed"] == 1 and sorted(held.received) == [n for n in range(10) if n != 3]


def test_a_file_planted_in_the_directory_is_not_drained(held: Held, tmp_path: Path) -> None:
    held.write(5)
    planted = tmp_path / "spill" / f"spill-{os.uname().nodename}-{os.getpid()}-999999.jsonl"
    planted.write_text(json.dumps({"name": "planted", "span_id": "f" * 16, "attributes": {"n": 99}}) + "\n")
    held.release()
    held.drained()
    assert sorted(held.received) == list(range(5))
    assert planted.exists()


def test_a_segment_replaced_by_a_symlink_does_not_redirect_later_writes(held: Held, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (path,) = held.write(5)
    path.unlink()
    path.symlink_to(victim)
    held.spill.write([span(n) for n in range(5, 10)], FROM_QUEUE)
    assert victim.read_text() == "precious\n"
    held.release()
    assert held.drained()["failed"] == 0 and sorted(held.received) == list(range(10))


# -- shut down --------------------------------------------------------------------


def test_a_span_offered_after_shutdown_is_counted_dropped_at_once_and_starts_no_thread(held: Held) -> None:
    """A span ending while the bridge shuts down reaches the spill after it stopped: it is in the account
    when ``offer`` returns (not left to a writer started afterwards), and no spill thread starts."""
    held.spill.shutdown(5.0)
    before = {t.name for t in threading.enumerate()}
    held.spill.offer(span(1), 100)
    counts = held.counts.snapshot()
    assert (counts["dropped"], counts["spilled"]) == (1, 0)
    assert {t.name for t in threading.enumerate()} - before == set()
    assert held.spill.status()["files"] == []
