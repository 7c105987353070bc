"""The run lock and the host's boot slots.

The run lock: an exclusive flock on ``<runtimeDir>/launcher.lock`` held for the launcher's whole life and
inherited by the VMM (flock locks belong to the open file description, flock(2)), so "lock held" means
"a launcher or its VMM is alive". The lock file itself is never removed (unlinking a lock file races with a
second opener).

Boot slots (config ``bootSlots``): ``<directory>/slot-0.lock`` .. ``slot-<count-1>.lock``, each an exclusive
flock held by at most one booting guest's launcher, so at most ``count`` guests of a host boot at once (the
idea of OpenStack Nova's ``max_concurrent_builds``). The files are never removed either.
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


def try_boot_slot(directory: str, count: int) -> tuple[int, int] | None:
    """Lock the first free slot of ``directory`` (created 0755 with its parents if missing) without blocking.

    Returns ``(fd, index)`` (close the fd to release; not inheritable, so a VMM never holds a slot), or None when
    all ``count`` slots are held. Raises OSError when the directory or a slot file cannot be created or opened.
    """
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for index in range(count):
        # read-only is enough for flock(2), so slot files another user created work too
        fd = os.open(os.path.join(directory, f"slot-{index}.lock"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        return fd, index
    return None


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
