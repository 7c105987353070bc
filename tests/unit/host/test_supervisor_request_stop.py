"""host.supervisor.request_stop signals only the VM's own launcher: the process holding the VM's lock whose config
argument lies in the VM's state directory (real processes and flocks, no launcher needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup

HOLD = ("import fcntl, sys, time; fd = open(sys.argv[1], 'a'); fcntl.flock(fd, fcntl.LOCK_EX);"
        " open(sys.argv[1] + '.held', 'w').close(); time.sleep(60)")


def _paths(tmp_path) -> sup.LauncherPaths:
    for d in ("state", "run", "log"):
        (tmp_path / d).mkdir()
    return sup.LauncherPaths(str(tmp_path / "state"), str(tmp_path / "run"), str(tmp_path / "log"), "default_vm")


def _holder(paths: sup.LauncherPaths, config: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, paths.lock, "--config", config])
    deadline = time.monotonic() + 30
    while not os.path.exists(paths.lock + ".held"):
        assert time.monotonic() < deadline and proc.poll() is None, "the lock holder did not start"
        time.sleep(0.05)
    return proc


def test_the_vms_launcher_is_signalled(tmp_path):
    paths = _paths(tmp_path)
    proc = _holder(paths, paths.config(3))
    try:
        assert sup.request_stop(paths)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_holder_that_is_not_the_vms_launcher_is_left_alone(tmp_path):
    """The VMM holding the lock after its launcher was SIGKILLed, or another process on the launcher's old pid."""
    paths = _paths(tmp_path)
    proc = _holder(paths, str(tmp_path / "elsewhere" / "boot-3.json"))
    try:
        assert sup.running_boot(paths) == (3, proc.pid)  # the lock is held
        assert not sup.request_stop(paths)
        time.sleep(0.5)
        assert proc.poll() is None, "a process that is not the VM's launcher got SIGTERM"
    finally:
        proc.kill()
        proc.wait()
