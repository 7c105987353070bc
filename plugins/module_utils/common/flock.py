# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One exclusive advisory lock (flock(2)) on a lock file, shared by the places that serialise runs on a host."""

from __future__ import annotations

import contextlib
import fcntl
from typing import Iterator


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing; its directory must exist) for the block.

    Blocks until the lock is free; released when the block ends or the process dies.

    Raises:
        OSError: the lock file cannot be opened.
    """
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
