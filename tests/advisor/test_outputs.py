"""Output paths: checked before the work, never a link, a device or an input, and written whole."""
from __future__ import annotations

import os
import stat

import pytest

from advisor.outputs import OutputError, output_file, output_folder, replacing, write_atomic


def test_a_new_file_in_a_folder_that_takes_files_is_accepted_and_nothing_is_left_behind(tmp_path):
    assert output_file(str(tmp_path / "new.json"), "--out") == tmp_path / "new.json"
    assert output_file(str(tmp_path / "made" / "new.json"), "--out", make_folder=True).parent.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made"]  # the write check's scratch file is gone


@pytest.mark.parametrize("make, needle", [
    (lambda d: (d / "link.json").symlink_to(d / "target.json") or d / "link.json", "symbolic link"),
    (lambda d: os.mkfifo(d / "fifo.json") or d / "fifo.json", "not a regular file"),
    (lambda d: (d / "folder").mkdir() or d / "folder", "a folder"),
    (lambda d: d / "missing" / "x.json", "does not exist"),
])
def test_what_must_not_take_the_output_is_refused_naming_the_option(tmp_path, make, needle):
    (tmp_path / "target.json").write_text("kept")
    with pytest.raises(OutputError, match=f"bad --out .*{needle}"):
        output_file(str(make(tmp_path)), "--out")
    assert (tmp_path / "target.json").read_text() == "kept"


def test_a_device_or_a_file_the_command_reads_is_refused(tmp_path):
    with pytest.raises(OutputError, match="not a regular file"):
        output_file("/dev/null", "--out")
    read = tmp_path / "profile.json"
    read.write_text("{}")
    os.link(read, tmp_path / "same.json")  # another name of the same file
    for name in ("profile.json", "same.json"):
        with pytest.raises(OutputError, match="the file this command reads"):
            output_file(str(tmp_path / name), "--out", reads=(None, str(read)))


def test_a_folder_that_takes_no_files_is_refused_before_the_work():
    with pytest.raises(OutputError, match="cannot write there"):
        output_file("/proc/x.json", "--out")
    with pytest.raises(OutputError, match="cannot make folder"):
        output_folder("/proc/wheels", "--out")


def test_a_write_that_fails_leaves_the_old_file_whole_and_no_temporary_file(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["profile.json"]


def test_an_atomic_write_replaces_the_file_and_keeps_its_mode(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.json"
    write_atomic(fresh, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open() would make it, not mkstemp's 0600
