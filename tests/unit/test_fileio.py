"""The one atomic writer: only regular files, temp files beside the target, no leftovers."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.fileio import clean_stale_temps, write_bytes_atomic, write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


def _temps(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_a_fifo_is_refused_and_kept(tmp_path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="special file"):
        write_json_atomic(str(fifo), {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _temps(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_never_replaced(tmp_path) -> None:
    # A private copy of /dev/null: the real one must never be at stake in a test.
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    before = os.lstat(node)
    with pytest.raises(UserError, match="special file"):
        write_bytes_atomic(str(node), b"x")
    after = os.lstat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert _temps(tmp_path) == []


def test_a_symlink_is_refused_unless_forced(tmp_path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(UserError, match="symbolic link"):
        write_bytes_atomic(str(link), b"new")
    assert real.read_text() == "old" and link.is_symlink()
    write_bytes_atomic(str(link), b"new", force=True)
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize("target", ["{tmp}/d", "{tmp}/d/", "/"])
def test_a_directory_is_refused_without_a_temp_file(tmp_path, target) -> None:
    (tmp_path / "d").mkdir()
    root_before = set(os.listdir("/"))
    with pytest.raises(UserError, match="directory"):
        write_bytes_atomic(target.format(tmp=tmp_path), b"x")
    assert (tmp_path / "d").is_dir() and _temps(tmp_path) == [] and _temps(tmp_path / "d") == []
    assert {n for n in set(os.listdir("/")) - root_before if n.startswith(".tmp-")} == set()


@pytest.mark.parametrize("path", ["/proc/self/ppsim.json", "{tmp}/" + "x" * 300 + ".json",
                                  "{tmp}/file.json/inside.json"])
def test_unwritable_paths_are_user_errors(tmp_path, path) -> None:
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(UserError):
        write_bytes_atomic(path.format(tmp=tmp_path), b"x")


def test_simulate_into_a_directory_exits_2_in_one_line(tmp_path, capsys) -> None:
    rc = main(["simulate", "--trace", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is a directory" in err[0], err


def test_stale_temp_of_a_dead_writer_is_removed_on_the_next_write(tmp_path) -> None:
    # An interrupted writer: a real process killed while its temp file exists.
    target = tmp_path / "big.json"
    code = ("import os, sys, time; from ppsim import fileio\n"
            "os.fsync = lambda fd: time.sleep(60)\n"
            f"fileio.write_bytes_atomic({str(target)!r}, b'x' * 1000000)\n")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not _temps(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _temps(tmp_path), "the writer never made its temp file"
        time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert len(_temps(tmp_path)) == 1 and not target.exists()
    (tmp_path / ".tmp-other-file").write_text("not ours")
    write_json_atomic(str(target), [1])
    assert target.read_text() == "[1]\n"
    assert _temps(tmp_path) == [".tmp-other-file"]


def test_a_live_writers_temp_file_is_kept(tmp_path) -> None:
    live = tmp_path / f".tmp-{os.getppid()}-abc123-out.json"
    live.write_text("in progress")
    assert clean_stale_temps(str(tmp_path), "out.json") == []
    assert live.exists()


@given(data=st.binary(max_size=2000), name=st.text(
    st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=40))
def test_writes_land_whole_and_leave_nothing_behind(tmp_path_factory, data, name) -> None:
    folder = tmp_path_factory.mktemp("w")
    if name in (".", ".."):
        return
    path = folder / name
    write_bytes_atomic(str(path), data)
    write_bytes_atomic(str(path), data[::-1])
    assert path.read_bytes() == data[::-1]
    assert os.listdir(folder) == [name]


def test_errors_name_the_flag_when_told(tmp_path) -> None:
    with pytest.raises(UserError) as err:
        write_bytes_atomic(str(tmp_path), b"x", field="--trace")
    assert str(err.value).startswith(f"--trace: {tmp_path} is a directory")


def test_a_long_but_legal_name_is_written(tmp_path) -> None:
    path = tmp_path / ("n" * 250)
    write_bytes_atomic(str(path), b"x")
    assert path.read_bytes() == b"x" and os.listdir(tmp_path) == [path.name]


def test_force_flag_writes_through_a_link_and_only_then(tmp_path, capsys):
    from ppsim.cli.main import main

    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["simulate", "--trace", str(link)]) == 2
    assert "--force" in capsys.readouterr().err and not target.exists()
    assert main(["simulate", "--trace", str(link), "--force"]) == 0
    assert link.is_symlink() and target.stat().st_size > 0
    # The switch does not outlive its command.
    target.unlink()
    assert main(["simulate", "--trace", str(link)]) == 2
