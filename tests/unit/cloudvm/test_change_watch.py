"""host/watch.py: the cloudvm wait wakes on the launcher's file events (inotify) and on its exit (pidfd), with
real files and real processes; without either it only times out."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from ansible_collections.zjusct.cloud.plugins.module_utils.host.watch import ChangeWatch

LONG = 30.0  # a wait this long only ends early on an event: returning True proves the event woke it


def _later(seconds: float, action) -> threading.Thread:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def _write_atomically(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("ready\n")
    os.rename(tmp, path)


def test_a_file_the_launcher_writes_ends_the_wait(tmp_path: Path) -> None:
    with ChangeWatch(str(tmp_path)) as watch:
        assert watch.watching
        timer = _later(0.2, lambda: _write_atomically(tmp_path / "ready-1"))
        assert watch.wait(LONG) is True
        timer.join()


def test_an_event_during_the_pass_before_the_wait_is_not_lost(tmp_path: Path) -> None:
    with ChangeWatch(str(tmp_path)) as watch:
        (tmp_path / "result-1.json").write_text("{}")  # happens while the caller reconciles
        assert watch.wait(LONG) is True
        assert watch.wait(0.1) is False, "drained: the same event does not wake twice"


def test_the_launcher_exiting_ends_the_wait(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        with ChangeWatch(str(tmp_path)) as watch:
            assert watch.wait(LONG, pid=launcher.pid) is True
        assert launcher.poll() is not None or launcher.wait(5) == 0
    finally:
        launcher.kill()
        launcher.wait()


def test_nothing_happening_is_a_timeout(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ChangeWatch(str(tmp_path)) as watch:
            (tmp_path.parent / f"{tmp_path.name}-elsewhere").write_text("x")  # outside the directory
            assert watch.wait(0.3, pid=sleeper.pid) is False
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_directory_made_after_the_watch_is_watched_from_the_next_wait(tmp_path: Path) -> None:
    state = tmp_path / "vms" / "default_alice"
    with ChangeWatch(str(state)) as watch:
        assert not watch.watching
        assert watch.wait(0.1) is False
        state.mkdir(parents=True)
        assert watch.wait(0.1) is False  # this wait adds the watch
        assert watch.watching
        timer = _later(0.2, lambda: (state / "spawned-1").write_text(""))
        assert watch.wait(LONG) is True
        timer.join()


def test_an_exited_pid_is_not_waited_on(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with ChangeWatch(str(tmp_path)) as watch:
        assert watch.wait(0.1, pid=gone.pid) is False
