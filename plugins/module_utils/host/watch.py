# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wake a waiting module when a VM's launcher files change or its launcher exits, instead of sleeping a fixed poll.

The ``cloudvm`` module's wait (:func:`host.cloudvm._wait`) reconciles, then sleeps until something may have
changed: the launcher writes its ready marker, result and spawn marker into the VM's state directory
(:class:`host.supervisor.LauncherPaths`) and releases its lock only by exiting. :class:`ChangeWatch` watches that
directory with inotify(7) (``IN_CREATE``, ``IN_MOVED_TO``, ``IN_CLOSE_WRITE``, ``IN_DELETE``) and the launcher
with a pidfd (pidfd_open(2): readable once the process has exited), so the next pass runs within milliseconds of
the event. The wait stays bounded by a timeout, so anything neither source reports is still seen by the next pass.

Where inotify or pidfd_open is unavailable (another kernel, Python < 3.9 for ``os.pidfd_open``), the watch degrades
to the plain timeout: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
from typing import Optional

# linux/inotify.h
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_ONLYDIR = 0x01000000
WATCH_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR


def _libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


class ChangeWatch:
    """inotify on one directory plus an optional pidfd; :meth:`wait` returns when either fires or on timeout.

    Use as a context manager (the file descriptors are closed on exit). Create it *before* the pass whose
    result you wait to change, so an event during that pass is not lost: events queue until the next
    :meth:`wait`, which then returns at once.
    """

    def __init__(self, directory: str) -> None:
        """Args: directory: the directory to watch (it may not exist yet: then :meth:`wait` retries the watch)."""
        self.directory = directory
        self._libc = _libc()
        self._fd: Optional[int] = None
        self._watching = False
        if self._libc is not None:
            fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
        self._add_watch()

    def _add_watch(self) -> None:
        if self._fd is None or self._watching or self._libc is None:
            return
        if self._libc.inotify_add_watch(self._fd, os.fsencode(self.directory), WATCH_MASK) >= 0:
            self._watching = True

    @property
    def watching(self) -> bool:
        """True when inotify watches the directory (False: :meth:`wait` only times out or sees the pid exit)."""
        return self._watching

    def wait(self, timeout: float, pid: Optional[int] = None) -> bool:
        """Block until the directory changes, process ``pid`` exits, or ``timeout`` seconds pass.

        Args:
            timeout: the longest wait, in seconds (the fallback poll).
            pid: a process whose exit also ends the wait (the VM's launcher); None or an exited pid: not watched.

        Returns:
            True when woken by an event (queued events are drained), False on timeout.
        """
        self._add_watch()
        fds = [self._fd] if self._watching and self._fd is not None else []
        pidfd = _pidfd(pid)
        if pidfd is not None:
            fds.append(pidfd)
        try:
            ready = select.select(fds, [], [], max(timeout, 0.0))[0] if fds else _sleep(timeout)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        if self._fd is not None and self._fd in ready:
            self._drain()
        return bool(ready)

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self._fd, 65536):  # type: ignore[arg-type]
                    return
            except BlockingIOError:
                return

    def close(self) -> None:
        """Close the inotify descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._watching = False

    def __enter__(self) -> "ChangeWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pidfd(pid: Optional[int]) -> Optional[int]:
    """A pidfd of ``pid`` (readable once it exits), or None: no pid, gone already, or no pidfd_open here."""
    opener = getattr(os, "pidfd_open", None)
    if not pid or opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOSYS, errno.EINVAL, errno.EPERM):
            return None
        raise


def _sleep(timeout: float) -> list:
    select.select([], [], [], max(timeout, 0.0))
    return []
