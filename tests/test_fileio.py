"""The atomic-write helper: the target is replaced only when the whole write succeeded."""
import os

import pytest

from slide.fileio import atomic_link, atomic_write, write_bytes, write_text


def test_write_text_and_bytes_replace_the_target(tmp_path):
    p = tmp_path / "a.txt"
    write_text(p, "first")
    write_text(p, "second é")
    assert p.read_text(encoding="utf-8") == "second é"
    write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_a_failure_mid_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "model.npz"
    write_bytes(p, b"good")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_write(p) as f:
            f.write(b"half a fi")
            raise RuntimeError("disk full")
    assert p.read_bytes() == b"good"
    assert sorted(os.listdir(tmp_path)) == ["model.npz"]


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(tmp_path / "x", mode="a"):
            pass


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002, 0o000])
def test_written_files_get_the_mode_the_umask_allows(tmp_path, umask):
    """mkstemp's 0600 leaked into every checkpoint and config (issue 28): a file written
    atomically has the mode a plain open() would give it, new or replacing one."""
    old = os.umask(umask)
    try:
        write_text(tmp_path / "a.txt", "x")
        write_bytes(tmp_path / "a.txt", b"y")       # replacing keeps the same rule
        with atomic_write(tmp_path / "b.bin") as f:
            f.write(b"z")
    finally:
        os.umask(old)
    for name in ("a.txt", "b.bin"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o666 & ~umask, name


def test_a_directory_or_a_missing_folder_is_named_in_the_error(tmp_path):
    """The error names the caller's path (not the temporary file's) and leaves nothing."""
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory.*'.*d'"):
        write_text(tmp_path / "d", "x")
    with pytest.raises(FileNotFoundError, match="no directory .*nowhere"):
        write_text(tmp_path / "nowhere" / "f.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert list((tmp_path / "d").iterdir()) == []


def test_a_link_replaces_the_target_or_changes_nothing(tmp_path):
    src, dst = tmp_path / "ckpt.slide", tmp_path / "model.slide"
    write_bytes(src, b"new model")
    write_bytes(dst, b"old model")
    assert atomic_link(src, dst)
    assert os.path.samefile(src, dst) and dst.read_bytes() == b"new model"
    # no source: nothing changed, nothing left behind, the caller is told to write it
    assert not atomic_link(tmp_path / "missing.slide", dst)
    assert dst.read_bytes() == b"new model"
    assert sorted(os.listdir(tmp_path)) == ["ckpt.slide", "model.slide"]
