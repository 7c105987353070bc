# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``local`` backup destination (:class:`storage.destination.BackupDestination`): a directory.

Layout (docs/backup-restore.md "What a backup is")::

    <dir>/.lock                 flock: one backup or retention run at a time
    <dir>/<id>/                 a complete backup: data.rbdiff, manifest.json, complete (written last)
    <dir>/.partial-<id>/        a backup being written or interrupted; never restorable

Crash safety: a backup is written into ``.partial-<id>/``; its data file is flushed every 64 MiB while it is
written (so the final flush is short) and fsynced; ``manifest.json`` is written atomically (a temporary name,
fsync, rename); then ``complete`` (the manifest's sha256) is written and fsynced, and only then is the directory
renamed to ``<id>`` and the parent directory fsynced. Killed at any point, nothing carries a backup id as its
name without a matching ``complete``. Retention renames ``<id>`` to ``.partial-deleted-<id>`` before removing it.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from typing import Any, BinaryIO, Callable, List, Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    COMPLETE_FILE,
    MANIFEST_FILE,
    BackupError,
    Manifest,
    ManifestError,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination import PARTIAL_PREFIX


def fsync_dir(path: str) -> None:
    """fsync a directory (makes a rename or a new entry in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``path`` under a temporary name, fsync it, rename it into place and fsync the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def read_manifest(backup_dir: str) -> Manifest:
    """Read ``manifest.json`` of a complete backup directory; the ``complete`` marker must hold the manifest's
    sha256. Raises ManifestError (naming the directory) otherwise."""
    marker = os.path.join(backup_dir, COMPLETE_FILE)
    try:
        with open(os.path.join(backup_dir, MANIFEST_FILE), "rb") as f:
            raw = f.read()
        with open(marker, encoding="ascii") as f:
            mark = f.read().strip()
    except OSError as exc:
        raise ManifestError(f"{backup_dir}: not a complete backup ({exc.strerror}: {exc.filename})") from None
    if mark != hashlib.sha256(raw).hexdigest():
        raise ManifestError(f"{backup_dir}: {COMPLETE_FILE} does not match {MANIFEST_FILE} (manifest altered?)")
    try:
        return Manifest.from_dict(json.loads(raw))
    except ValueError as exc:
        raise ManifestError(f"{backup_dir}: {exc}") from None


def scan_dir(dest: str) -> Tuple[List[Manifest], List[str], List[str]]:
    """List a destination directory: (complete manifests, partial directory names, problems with other
    directories). A missing directory has nothing."""
    complete: List[Manifest] = []
    partial: List[str] = []
    bad: List[str] = []
    if not os.path.isdir(dest):
        return complete, partial, bad
    for name in sorted(os.listdir(dest)):
        path = os.path.join(dest, name)
        if name.startswith(PARTIAL_PREFIX):
            partial.append(name)
        elif name.startswith(".") or not os.path.isdir(path):
            continue
        else:
            try:
                m = read_manifest(path)
            except ManifestError as exc:
                bad.append(str(exc))
                continue
            if m.id != name:
                bad.append(f"{path}: manifest id {m.id} does not match the directory name")
                continue
            complete.append(m)
    return complete, partial, bad


class DestLock:
    """Exclusive ``flock`` on ``<dest>/.lock`` so two backups/retentions never touch one destination at once."""

    def __init__(self, dest: str) -> None:
        self.path = os.path.join(dest, ".lock")
        self.fd: Optional[int] = None

    def __enter__(self) -> "DestLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (_errno.EWOULDBLOCK, _errno.EAGAIN):
                raise BackupError(f"dest: {os.path.dirname(self.path)} is locked by another backup or restore "
                                  "in progress") from None
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _background_fsync(fd: int) -> Callable[[], float]:
    """fsync ``fd`` on a thread (then close it); the returned function joins it, re-raises its error and returns
    the seconds it took."""
    state: dict = {}

    def run() -> None:
        t = time.monotonic()
        try:
            os.fsync(fd)
        except BaseException as exc:
            state["error"] = exc
        finally:
            os.close(fd)
            state["seconds"] = round(time.monotonic() - t, 3)

    thread = threading.Thread(target=run, name="backup-fsync", daemon=True)
    thread.start()

    def wait() -> float:
        thread.join()
        if "error" in state:
            raise state.pop("error")
        return float(state["seconds"])

    return wait


class LocalFile:
    """A file of a backup being written (:class:`storage.destination.StagedFile`): raw writes, an ``fdatasync``
    every 64 MiB so flushing overlaps with the stream instead of piling up for the final fsync."""

    EVERY = 64 * 1024 * 1024

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "xb", buffering=0)
        self.pending = 0

    def write(self, data: Any) -> int:
        mv = memoryview(data)
        while mv:
            n = self.f.write(mv) or 0
            mv = mv[n:]
        self.pending += len(data)
        if self.pending >= self.EVERY:
            os.fdatasync(self.f.fileno())
            self.pending = 0
        return len(data)

    def fileno(self) -> int:
        return self.f.fileno()

    def finish(self) -> Callable[[], float]:
        wait = _background_fsync(os.dup(self.f.fileno()))
        self.f.close()
        return wait

    def close(self) -> None:
        """Close without the durability promise (on failure paths)."""
        self.f.close()


class LocalStaging:
    """``<dir>/.partial-<id>/`` (:class:`storage.destination.BackupStaging`)."""

    def __init__(self, root: str, backup_id: str) -> None:
        self.root = root
        self.backup_id = backup_id
        self.name = PARTIAL_PREFIX + backup_id
        self.path = os.path.join(root, self.name)
        os.mkdir(self.path, 0o700)

    def create(self, name: str) -> LocalFile:
        return LocalFile(os.path.join(self.path, name))

    def write_manifest(self, raw: bytes) -> None:
        write_atomic(os.path.join(self.path, MANIFEST_FILE), raw)

    def open(self, name: str) -> BinaryIO:
        return open(os.path.join(self.path, name), "rb", buffering=0)

    def local_path(self, name: str) -> Optional[str]:
        return os.path.join(self.path, name)

    def commit(self, complete: bytes) -> None:
        write_atomic(os.path.join(self.path, COMPLETE_FILE), complete)
        os.rename(self.path, os.path.join(self.root, self.backup_id))
        fsync_dir(self.root)

    def abort(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class LocalDirectory:
    """The ``local`` destination: a directory (module docstring). ``url`` is a path or a ``file://`` URL; ``~`` is
    expanded; the path is used as given (a symlink is followed), its tag from its real path."""

    kind = "local"

    def __init__(self, url: str) -> None:
        self.url = url
        path = url[len("file://"):] if url.startswith("file://") else url
        self.path = os.path.abspath(os.path.expanduser(path))

    def tag_source(self) -> str:
        return self.path

    def prepare(self) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)

    def lock(self) -> DestLock:
        return DestLock(self.path)

    def scan(self) -> Tuple[List[Manifest], List[str], List[str]]:
        return scan_dir(self.path)

    def stage(self, backup_id: str) -> LocalStaging:
        return LocalStaging(self.path, backup_id)

    def remove_partial(self, name: str) -> None:
        if not name.startswith(PARTIAL_PREFIX) or "/" in name:
            raise ValueError(f"not a partial entry: {name!r}")
        shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)

    def delete(self, backup_id: str) -> None:
        doomed = os.path.join(self.path, PARTIAL_PREFIX + "deleted-" + backup_id)
        os.rename(os.path.join(self.path, backup_id), doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def open_file(self, backup_id: str, name: str) -> BinaryIO:
        return open(os.path.join(self.path, backup_id, name), "rb", buffering=0)

    def local_path(self, backup_id: str, name: str) -> Optional[str]:
        return os.path.join(self.path, backup_id, name)
