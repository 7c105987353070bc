# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filesystem effects of the image build: removing a build tree safely, atomic writes, atomic publication.

A debootstrap target may still carry mounts (proc, sys, a bind-mounted /dev when debootstrap believes it runs
in a container) after a killed build. Removing such a tree naively would delete the host's device nodes, so
:func:`remove_tree` unmounts everything below the path first (mount points from /proc/self/mountinfo, deepest
first) and then refuses to cross into any other filesystem.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError


class FsError(CloudError, OSError):
    """A filesystem step failed; the message names the path."""


def _unescape_mountinfo(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo (proc(5)).
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_below(path: str, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below ``path``, deepest first (field 5 of /proc/self/mountinfo)."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            mountinfo = fh.read()
    root = os.path.realpath(path).rstrip("/") or "/"
    found = []
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        point = _unescape_mountinfo(parts[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_below(path: str, timeout: float = 60.0) -> list[str]:
    """Unmount every mount point at or below ``path`` (lazily if busy). Returns what was unmounted."""
    done = []
    for point in mounts_below(path):
        proc = subprocess.run(["umount", point], capture_output=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            proc = subprocess.run(["umount", "-l", point], capture_output=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise FsError(f"cannot unmount {point}: {proc.stderr.decode(errors='replace').strip()}")
        done.append(point)
    return done


def remove_tree(path: str) -> bool:
    """Remove ``path`` recursively without leaving its filesystem. Returns False if it did not exist.

    Raises:
        FsError: something below ``path`` is on another filesystem even after unmounting.
    """
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(path)
        return True
    unmount_below(path)
    dev = top.st_dev
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames + dirnames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if st.st_dev != dev:
                raise FsError(f"{full} is on another filesystem; refusing to remove it")
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(full)
            else:
                os.unlink(full)
    os.rmdir(path)
    return True


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` via a temp file, fsync and rename. Returns False if the content was equal."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                os.chmod(path, mode)
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(staging: str, final: str) -> None:
    """Move the finished ``staging`` directory to ``final`` by rename (same filesystem).

    An existing ``final`` (a forced rebuild) is first renamed aside and removed after the new set is in
    place, so at every instant ``final`` is either absent or a complete set.
    """
    parent = os.path.dirname(final)
    old = None
    if os.path.lexists(final):
        old = os.path.join(parent, f".old-{os.path.basename(final)}-{os.getpid()}")
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(parent)
    if old is not None:
        remove_tree(old)
