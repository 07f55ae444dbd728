"""Private directories and files: created 0700/0600, and anything another user could have prepared is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from verl_otel_bridge._internal.private_files import (
    UnsafePathError,
    open_private_new,
    open_private_output,
    open_private_read,
    private_dir,
)

#: Another local user, played by ``nobody`` (the tests run as root here; skipped otherwise).
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_directory_and_its_parents_are_created_0700(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b")
    assert made == tmp_path / "a" / "b"
    assert mode(tmp_path / "a") == 0o700
    assert mode(made) == 0o700


def test_an_existing_private_directory_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "kept").write_text("x")
    assert private_dir(tmp_path / "d") == tmp_path / "d"
    assert (tmp_path / "d" / "kept").read_text() == "x"


@pytest.mark.parametrize("bits", [0o755, 0o750, 0o707, 0o1777])
def test_a_directory_open_to_others_is_refused_and_left_unchanged(tmp_path: Path, bits: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(bits)
    with pytest.raises(UnsafePathError, match=f"{shared}.*mode {bits:04o}.*chmod 700"):
        private_dir(shared)
    assert mode(shared) == bits


@as_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=f"{theirs}.*uid {NOBODY}, not to this user"):
        private_dir(theirs)


def test_a_symlink_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        private_dir(tmp_path / "link")


def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(UnsafePathError, match="not a directory"):
        private_dir(tmp_path / "f")


def test_new_files_are_0600_and_never_reuse_a_name(tmp_path: Path) -> None:
    fd = open_private_new(tmp_path / "new")
    try:
        os.write(fd, b"line\n")
    finally:
        os.close(fd)
    assert mode(tmp_path / "new") == 0o600
    with pytest.raises(FileExistsError):
        open_private_new(tmp_path / "new")


def test_a_planted_symlink_is_not_followed_on_creation(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "planted").symlink_to(victim)
    with pytest.raises(FileExistsError):
        open_private_new(tmp_path / "planted")
    assert victim.read_text() == "precious\n"


def test_reading_accepts_only_the_users_own_private_regular_files(tmp_path: Path) -> None:
    good = tmp_path / "good"
    os.close(open_private_new(good))
    os.close(open_private_read(good))
    (tmp_path / "link").symlink_to(good)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_private_read(tmp_path / "link")
    good.chmod(0o644)
    with pytest.raises(UnsafePathError, match="mode 0644"):
        open_private_read(good)
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_private_read(tmp_path / "fifo")
    with pytest.raises(FileNotFoundError):
        open_private_read(tmp_path / "gone")


@as_root
def test_reading_refuses_a_file_of_another_user(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    os.close(open_private_new(planted))
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=f"uid {NOBODY}"):
        open_private_read(planted)


def test_a_jsonl_capture_is_created_0600_and_appended_to_as_the_users_own(tmp_path: Path) -> None:
    from verl_otel_bridge._internal.exporters.jsonl import JsonlFile

    path = tmp_path / "new" / "spans.jsonl"
    JsonlFile(path).close()
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    path.write_text("kept\n")
    fd = open_private_output(path)  # the user's own file: appended to as it is
    os.write(fd, b"more\n")
    os.close(fd)
    assert path.read_text() == "kept\nmore\n"


def test_a_jsonl_capture_refuses_a_link_and_another_users_file(tmp_path: Path) -> None:
    from verl_otel_bridge._internal.config import ConfigError
    from verl_otel_bridge._internal.exporters.jsonl import JsonlFile

    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "link.jsonl").symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        JsonlFile(tmp_path / "link.jsonl")
    if os.geteuid() == 0:
        planted = tmp_path / "planted.jsonl"
        planted.write_text("")
        os.chown(planted, NOBODY, NOBODY)
        with pytest.raises(ConfigError, match="another user"):
            JsonlFile(planted)


def test_the_html_report_is_written_0600_and_never_through_a_link(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import verl_otel_bridge as vob
    from verl_otel_bridge.cli.app import build_cli

    capture = tmp_path / "spans.jsonl"
    bridge = vob.Bridge(vob.BridgeConfig(exporter="jsonl", jsonl_path=str(capture), spill_max_bytes=0))
    with bridge.session(sample=0, session=0, global_steps=1):
        pass
    bridge.shutdown()
    runner = CliRunner()
    done = runner.invoke(build_cli(), ["report", str(capture), "--html", str(tmp_path / "r.html")])
    assert done.exit_code == 0, done.output
    assert mode(tmp_path / "r.html") == 0o600
    (tmp_path / "elsewhere.html").write_text("")
    (tmp_path / "link.html").symlink_to(tmp_path / "elsewhere.html")
    done = runner.invoke(build_cli(), ["report", str(capture), "--html", str(tmp_path / "link.html")])
    assert done.exit_code != 0
    assert (tmp_path / "elsewhere.html").read_text() == ""
