"""``hack/cluster.sh`` as an operator runs it: up, status, lose-node / restore-node, down — and down leaves nothing
on the host (processes, mounts, network namespaces, links, routes, cgroups, firewall rules, sysctls)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from zjusct_localcluster import hostnet
from zjusct_localcluster.cluster import missing_reason

from tests.conftest import require

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.multinode]

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "hack" / "cluster.sh"


def tool(*args: str, state: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ZJUSCT_LOCALCLUSTER": str(state)}
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A short state dir (containerd's socket paths under it must fit a Unix socket's 107 bytes)."""
    reason = missing_reason()
    require("multinode", reason is None, f"a local cluster needs {reason}")
    parent = Path(tempfile.mkdtemp(prefix="zjlc-"))
    state = parent / "state"
    try:
        yield state
    finally:
        if state.exists():  # the test failed before its own down
            tool("down", state=state)
        shutil.rmtree(parent, ignore_errors=True)


def test_up_status_lose_restore_down_leaves_nothing(state_dir: Path) -> None:
    markers = (str(state_dir),)
    before = hostnet.host_footprint(markers)

    up = tool("up", "--nodes", "2", "--ceph-osds", "1", state=state_dir)
    assert up.returncode == 0, up.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
    kubeconfig = Path(exports["KUBECONFIG"])
    assert kubeconfig == state_dir / "control-plane" / "kubeconfig" / "admin.kubeconfig" and kubeconfig.is_file()
    assert Path(exports["CEPH_CONF"]).is_file() and exports["ZJUSCT_LOCALCLUSTER"] == str(state_dir)
    during = hostnet.host_footprint(markers)
    assert during["netns"] == ["zjnode-node-1", "zjnode-node-2"] and hostnet.BRIDGE in during["links"]
    assert during["processes"] and during["cgroups"], during  # what the check below compares is really there

    status = tool("status", "--json", state=state_dir)
    assert status.returncode == 0, status.stdout + status.stderr
    st: dict[str, Any] = json.loads(status.stdout)
    assert st["ready"] and set(st["nodes"]) == {"node-1", "node-2"}
    assert all(st["nodes"]["node-1"][k] for k in ("containerd", "kubelet", "kube-proxy", "kube-router", "link"))
    assert st["ceph"] and all(st["ceph"].values()), st["ceph"]

    lose = tool("lose-node", "node-1", "--how", "agents", state=state_dir, timeout=120)
    assert lose.returncode == 0, lose.stderr
    st = json.loads(tool("status", "--json", state=state_dir).stdout)
    assert not st["nodes"]["node-1"]["kubelet"] and not st["nodes"]["node-1"]["containerd"]
    assert st["nodes"]["node-1"]["kube-proxy"] and st["nodes"]["node-1"]["link"]  # "agents" keeps these
    assert tool("status", state=state_dir).returncode == 1  # something is down: status says so
    restore = tool("restore-node", "node-1", state=state_dir, timeout=400)
    assert restore.returncode == 0, restore.stderr
    assert tool("status", state=state_dir).returncode == 0
    unknown = tool("lose-node", "node-9", state=state_dir, timeout=60)
    assert unknown.returncode == 2 and "node-9: no such node; nodes: node-1, node-2" in unknown.stderr

    t0 = time.monotonic()
    down = tool("down", state=state_dir)
    assert down.returncode == 0, down.stderr
    after = hostnet.host_footprint(markers)
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not state_dir.exists()
    assert time.monotonic() - t0 < 120


def test_up_refuses_bad_input_naming_the_option(tmp_path: Path) -> None:
    bad = tool("up", "--nodes", "5", state=tmp_path / "state", timeout=60)
    assert bad.returncode == 2
    assert "--nodes 5: must be 1..3" in bad.stderr
    deep = tmp_path / ("d" * 60) / "state"
    long_dir = tool("up", state=deep, timeout=60)
    assert long_dir.returncode == 2
    assert f"--state-dir {deep}: too long" in long_dir.stderr and "107 bytes" in long_dir.stderr
    assert not (tmp_path / "state").exists() and not deep.exists()  # nothing half-created
