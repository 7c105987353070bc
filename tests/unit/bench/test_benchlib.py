"""bench/benchlib.py: the nearest-rank percentile and the clean stop every bench script uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import benchlib


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([5.0], 50, 5.0),
    ([3.0, 1.0, 2.0], 50, 2.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0),   # rank ceil(0.5 * 4) = 2
    ([1.0, 2.0, 3.0, 4.0], 51, 3.0),   # rank ceil(2.04) = 3
    ([float(i) for i in range(1, 101)], 95, 95.0),
    ([float(i) for i in range(1, 21)], 95, 19.0),
    ([1.0, 2.0, 3.0], 100, 3.0),
])
def test_percentile_is_nearest_rank(values, p, expected):
    assert benchlib.percentile(values, p) == expected


@pytest.mark.parametrize(("values", "p"), [([], 50), ([1.0], 0), ([1.0], 101)])
def test_percentile_refuses_what_has_no_rank(values, p):
    with pytest.raises(ValueError, match="percentile"):
        benchlib.percentile(values, p)


def test_stop_process_kills_what_ignores_sigterm():
    proc = subprocess.Popen([sys.executable, "-c",
                             "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             "print('ready', flush=True)\n"
                             "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    assert benchlib.stop_process(proc, timeout=0.5) == -9
    proc.stdout.close()


def test_stop_process_returns_the_status_of_a_process_that_already_ended():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert benchlib.stop_process(proc) == 3


def test_rss_of_this_process_is_positive_and_of_no_process_an_error():
    import os

    assert benchlib.rss_mib(os.getpid()) > 1
    with pytest.raises(OSError):
        benchlib.rss_mib(2**22 + 12345)
