"""Helpers shared by the bench scripts: percentiles, timing, process RSS and the clean stop of a helper process.

Imported as ``import benchlib`` (a bench script's own directory is first on ``sys.path`` when it runs as
``python bench/<script>.py``; a script imported from elsewhere puts ``bench/`` there first, as qos_apply.py does).
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` by the nearest-rank method (no interpolation).

    Args:
        values: the samples (any unit; the result has the same unit), at least one.
        p: the percentile, 0 < p <= 100.

    Returns:
        The smallest sample such that at least ``p`` % of the samples are less than or equal to it.

    Raises:
        ValueError: ``values`` is empty or ``p`` is outside (0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile p={p} outside (0, 100]")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def timed(fn: Callable[[], object]) -> float:
    """Seconds (monotonic clock, fractional) that ``fn()`` took; its result is discarded, exceptions propagate."""
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS of /proc/<pid>/status).

    Raises:
        OSError: the process does not exist.
        ValueError: /proc/<pid>/status has no VmRSS line (a zombie or kernel thread).
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL it and reap it.

    Returns:
        The process's exit status (negative: the signal that ended it).
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
