"""host.supervisor.lock_table: one read of /proc/locks for a listing instead of one per VM.

Listing 10,000 running VMs of the host store (cloudvm_info, the inventory's host source) read the kernel's lock
table, one line per running launcher, once per VM: 285 s of a loaded 2-core machine in bench/inventory_scale.py.
``observed_vms`` now reads it once. The locks here are real flocks held by real processes (a stand-in launcher
with ``boot-<N>.json`` on its command line, as the launcher has).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as host
from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as _hostconfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore

# holds a flock on every path of argv[1:] that does not end in .json; says "locked" once it holds them all
HOLDER = ("import fcntl, sys, time\nfhs = []\nfor p in sys.argv[1:]:\n    if p.endswith('.json'):\n        continue\n"
          "    fh = open(p, 'a')\n    fcntl.flock(fh, fcntl.LOCK_EX)\n    fhs.append(fh)\n"
          "print('locked', flush=True)\ntime.sleep(3600)\n")


class Holders:
    """Stand-in launchers; every one is killed at the end of the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def hold(self, *paths: str, boot: int = 1) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, *paths, f"/state/boot-{boot}.json"],
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        return proc


@pytest.fixture
def holders() -> Iterator[Holders]:
    h = Holders()
    try:
        yield h
    finally:
        for proc in h.procs:
            proc.kill()
            proc.wait()


def _paths(root: Path, name: str) -> sup.LauncherPaths:
    paths = sup.LauncherPaths(str(root / "state" / name), str(root / "run" / name), str(root / "log"), name)
    for d in (paths.state_dir, paths.runtime_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    return paths


def _spawned(paths: sup.LauncherPaths, boot: int, when: float) -> None:
    Path(paths.config(boot)).write_text("{}")
    Path(paths.spawned(boot)).write_text(json.dumps({"pid": 1, "time": when, "startedAt": "2026-01-01T00:00:00Z"}))


def test_the_table_names_the_same_holders_as_the_per_path_read(tmp_path: Path, holders: Holders) -> None:
    held, free = _paths(tmp_path, "held"), _paths(tmp_path, "free")
    Path(free.lock).write_text("")
    proc = holders.hold(held.lock)
    table = sup.lock_table()
    assert table.holder(held.lock) == sup.lock_holder(held.lock) == proc.pid
    assert table.holder(free.lock) is None and sup.lock_holder(free.lock) is None
    assert table.holder(str(tmp_path / "missing.lock")) is None
    assert sup.running_boot(held, table) == (1, proc.pid)


def test_a_snapshot_older_than_a_new_launcher_does_not_make_it_lost(tmp_path: Path, holders: Holders) -> None:
    """A table read before the launcher took its lock shows no holder; past the spawn grace that alone would
    read as lost. The launcher was spawned after the table was read, so observe reads the lock again."""
    paths = _paths(tmp_path, "vm")
    stale = sup.LockTable({}, time.time() - 100)
    _spawned(paths, 1, time.time() - 60)  # spawned 40 s after the table, 60 s ago: past the grace
    proc = holders.hold(paths.lock)
    obs = sup.observe(paths, 1, "hv1", stale)
    assert obs.state == "alive", obs.detail
    # a launcher spawned long before the table was read and not holding its lock then is lost, as without a table
    proc.kill()
    proc.wait()
    old = sup.LockTable({}, time.time())
    assert sup.observe(paths, 1, "hv1", old).state == "lost"


def test_observed_vms_reads_the_lock_table_once_for_all_vms(tmp_path: Path, holders: Holders,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_path = tmp_path / "host.json"
    cfg_path.write_text(json.dumps({"store_path": str(tmp_path / "lib" / "cloud.db"), "node": "hv1",
                                    "state_dir": str(tmp_path / "state"), "runtime_dir": str(tmp_path / "run")}))
    cfg = _hostconfig.load(str(cfg_path))
    names = [f"vm{i}" for i in range(6)]
    with HostStore(cfg.store_path) as db:
        for name in names:
            db.create_vm("default", name, {"owner": "alice", "vcpus": 1, "memoryMiB": 512, "bootID": 1,
                                           "powerState": "Running"})
            db.update_vm("default", name, status={"phase": "Running", "reason": "SSHReady", "bootID": 1})
    locks = []
    for name in names[:4]:  # vm4 and vm5 have no launcher: lost
        paths = cfg.launcher_paths("default", name)
        Path(paths.state_dir).mkdir(parents=True)
        Path(paths.runtime_dir).mkdir(parents=True)
        _spawned(paths, 1, time.time() - 60)
        Path(paths.ready(1)).write_text(json.dumps({"readyAt": "2026-01-01T00:00:00Z"}))
        locks.append(paths.lock)
    for name in names[4:]:
        paths = cfg.launcher_paths("default", name)
        Path(paths.state_dir).mkdir(parents=True)
        _spawned(paths, 1, time.time() - 60)
    holders.hold(*locks)

    reads: list[str] = []
    real_open = open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if file == "/proc/locks":
            reads.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(sup, "open", counting_open, raising=False)
    vms = host.observed_vms(cfg)
    phases = {vm["metadata"]["name"]: (vm["status"]["phase"], vm["status"]["reason"]) for vm in vms}
    assert phases == {**{n: ("Running", "SSHReady") for n in names[:4]},
                      **{n: ("Failed", "LauncherLost") for n in names[4:]}}
    assert len(reads) == 1, f"/proc/locks read {len(reads)} times for {len(names)} VMs"
