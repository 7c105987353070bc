"""host.supervisor.start: the one write -> check -> spawn sequence of the cloudvm module and fc_launcher.

The "launcher" is a real program (a shell script standing in for ``zjusct-launcher``): ``check`` accepts or rejects
the config file it is given, ``run`` writes a marker. No systemd here: the spawn path is the detached Popen one.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup


def _launcher(tmp_path: Path, check_exit: int) -> list[str]:
    script = tmp_path / "launcher"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = check ]; then echo "bad field" >&2; exit {check_exit}; fi\n'
                      f'echo "$@" > {tmp_path}/ran\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [str(script)]


def _paths(tmp_path: Path) -> sup.LauncherPaths:
    return sup.LauncherPaths(str(tmp_path / "state"), str(tmp_path / "run"), str(tmp_path / "log"), "ns_vm")


def _wait_for_line(path: Path) -> str:
    """The first complete line the stand-in writes (the shell creates the file before it writes to it)."""
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never got a complete line"
        time.sleep(0.05)
    return path.read_text()


def test_start_writes_checks_and_spawns(tmp_path, monkeypatch):
    monkeypatch.setattr(sup, "systemd_is_init", lambda: False)
    paths = _paths(tmp_path)
    pid = sup.start(paths, {"vm": {"bootID": 3}}, _launcher(tmp_path, 0), sup.launcher_env(None))
    assert pid > 0
    assert json.loads(Path(paths.config(3)).read_text()) == {"vm": {"bootID": 3}}
    assert json.loads(Path(paths.spawned(3)).read_text())["pid"] == pid
    assert _wait_for_line(tmp_path / "ran").split() == ["run", "--config", paths.config(3)]


def test_a_rejected_config_is_removed_and_nothing_is_spawned(tmp_path, monkeypatch):
    monkeypatch.setattr(sup, "systemd_is_init", lambda: False)
    paths = _paths(tmp_path)
    with pytest.raises(sup.LauncherError, match="bad field"):
        sup.start(paths, {"vm": {"bootID": 3}}, _launcher(tmp_path, 1), sup.launcher_env(None))
    assert not os.path.exists(paths.config(3))
    assert not os.path.exists(paths.spawned(3))
    assert not (tmp_path / "ran").exists()


def test_a_failed_spawn_removes_the_config(tmp_path, monkeypatch):
    monkeypatch.setattr(sup, "systemd_is_init", lambda: False)
    paths = _paths(tmp_path)
    command = _launcher(tmp_path, 0)
    (tmp_path / "log").write_text("a file where the log directory should be")  # makedirs fails in spawn
    with pytest.raises(OSError):
        sup.start(paths, {"vm": {"bootID": 3}}, command, sup.launcher_env(None))
    assert not os.path.exists(paths.config(3))
    assert not os.path.exists(paths.spawned(3))
