"""image/fs.py: mount points below a tree, safe removal, atomic writes and publication (a real mount below a build
tree is unmounted by the guest_image integration test, which needs root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image import fs as image_fs
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import (
    FsError,
    mounts_below,
    publish_dir,
    remove_tree,
    write_atomic,
)


def test_mountinfo_escapes_are_decoded() -> None:
    info = "36 25 0:32 / /tmp/a\\040b/root/proc rw - proc proc rw\n"
    assert mounts_below("/tmp/a b", info) == ["/tmp/a b/root/proc"]


def test_mounts_below_are_deepest_first_and_only_below() -> None:
    info = ("1 0 0:1 / /srv/b rw - x x rw\n2 1 0:2 / /srv/b/root rw - x x rw\n3 2 0:3 / /srv/b/root/proc rw - x x\n"
            "4 0 0:4 / /srv/bb rw - x x rw\nshort line\n")
    assert mounts_below("/srv/b", info) == ["/srv/b/root/proc", "/srv/b/root", "/srv/b"]


def test_remove_tree_removes_a_tree_a_file_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "a" / "f").write_text("x")
    os.symlink("/etc", tmp_path / "t" / "link")  # removed, not followed
    assert remove_tree(str(tmp_path / "t")) is True and not (tmp_path / "t").exists()
    (tmp_path / "file").write_text("x")
    assert remove_tree(str(tmp_path / "file")) is True and not (tmp_path / "file").exists()
    assert remove_tree(str(tmp_path / "absent")) is False


def test_remove_tree_refuses_another_filesystem_it_cannot_unmount(tmp_path: Path, monkeypatch) -> None:
    # Simulate an entry on another device that unmounting did not clear.
    (tmp_path / "t" / "dev").mkdir(parents=True)
    real_lstat = os.lstat

    def fake_lstat(p, *a, **k):  # type: ignore[no-untyped-def]
        st = real_lstat(p, *a, **k)
        if str(p).endswith("/dev"):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *tuple(st)[3:]))
        return st

    monkeypatch.setattr(image_fs.os, "lstat", fake_lstat)
    monkeypatch.setattr(image_fs, "unmount_below", lambda path, timeout=60.0: [])
    with pytest.raises(FsError, match="another filesystem"):
        remove_tree(str(tmp_path / "t"))


def test_write_atomic_writes_only_a_change_and_sets_the_mode(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    assert write_atomic(path, b"one", 0o600) is True
    assert (tmp_path / "f").read_bytes() == b"one" and (os.stat(path).st_mode & 0o777) == 0o600
    assert write_atomic(path, b"one", 0o644) is False
    assert (os.stat(path).st_mode & 0o777) == 0o644, "the mode is set even when the content is equal"
    assert write_atomic(path, b"two") is True and (tmp_path / "f").read_bytes() == b"two"
    assert sorted(os.listdir(tmp_path)) == ["f"], "no temporary file is left"


def test_publish_dir_replaces_an_existing_set_whole(tmp_path: Path) -> None:
    final = tmp_path / "set"
    final.mkdir()
    (final / "old").write_text("old")
    staging = tmp_path / ".build"
    staging.mkdir()
    (staging / "new").write_text("new")
    publish_dir(str(staging), str(final))
    assert sorted(os.listdir(final)) == ["new"] and not staging.exists()
    assert sorted(os.listdir(tmp_path)) == ["set"], "the old set renamed aside is removed"
