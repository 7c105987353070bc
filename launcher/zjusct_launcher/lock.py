"""The run lock: an exclusive flock on ``<runtimeDir>/launcher.lock`` held for the launcher's whole life and
inherited by the VMM (flock locks belong to the open file description, flock(2)), so "lock held" means
"a launcher or its VMM is alive". The lock file itself is never removed (unlinking a lock file races with a
second opener).
"""

from __future__ import annotations

import errno
import fcntl
import os


class AlreadyRunning(Exception):
    pass


def acquire(path: str) -> int:
    """Open (creating 0600) and lock ``path`` without blocking. Returns the fd (not inheritable; pass it to the
    VMM explicitly). Raises AlreadyRunning when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise AlreadyRunning(path) from exc
        raise
    return fd


def is_held(path: str) -> bool:
    """True when some process holds a flock on ``path`` (for supervisors and tests). Never creates the file.

    Reads /proc/locks (proc(5): ``FLOCK ADVISORY WRITE <pid> <maj:min:inode> ...``, major/minor in hex) so the
    check never takes the lock itself, which could make a launcher starting at that instant see it busy. Falls
    back to a non-blocking shared flock when /proc/locks is unreadable.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if "FLOCK" in fields and ident in fields:
                    return True
        return False
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
