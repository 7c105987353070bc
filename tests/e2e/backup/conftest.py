"""Fixtures for the backup/restore journey: a private single-host cloud whose root volumes are Ceph RBD clones.

``rbd_cloud`` is the host-backend e2e setup (tests/e2e/host/conftest.py: private directories, its own network
namespace and "outside" namespace, the cached guest image) with ``volume_driver: rbd`` pointing at the session's
real test Ceph cluster (``ceph_cluster``). The launchers run inside the cloud's namespace, so a relay
(:mod:`.netns_relay`) makes the cluster's loopback ports (monitor, OSD, manager) reachable there as 127.0.0.1.
Everything is torn down afterwards, also after failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ceph import Cluster
from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS
from tests.e2e.host.conftest import REPO, Cloud, launcher_pids
from tests.integration.ceph.conftest import ceph_cluster  # noqa: F401  (session fixture used below)

from .netns_relay import NetnsRelay


def cluster_ports(cluster: Cluster) -> list[int]:
    """Every TCP port the cluster's daemons advertise on 127.0.0.1 (monitor, OSDs, manager)."""
    ports = set(cluster.mon_ports)
    for daemon in (json.loads(cluster.ceph("osd", "dump", "-f", "json"))["osds"]):
        ports.update(int(a["addr"].rsplit(":", 1)[1]) for a in daemon["public_addrs"]["addrvec"])
    mgr = json.loads(cluster.ceph("mgr", "dump", "-f", "json"))
    ports.update(int(a["addr"].rsplit(":", 1)[1]) for a in mgr.get("active_addrs", {}).get("addrvec", []))
    return sorted(p for p in ports if p)


@pytest.fixture(scope="module")
def rbd_cloud(guest_image, ceph_cluster: Cluster, tmp_path_factory) -> Iterator[Cloud]:  # noqa: F811
    root = tmp_path_factory.mktemp("rbdcloud")
    tag = uuid.uuid4().hex[:6]
    netns, outside = f"zjc-bk-{tag}", f"zjc-bo-{tag}"
    for ns in (netns, outside):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-n", outside, "addr", "add", "198.51.100.1/32", "dev", "lo"], check=True)
    relay = NetnsRelay(netns, cluster_ports(ceph_cluster))
    config = {
        "node": "e2e-backup",
        "store_path": str(root / "cloud.db"),
        "images_dir": str(Path(guest_image.dir).parent),
        "default_image": guest_image.manifest["name"],
        "volumes_dir": str(root / "volumes"),
        "state_dir": str(root / "state"),
        "runtime_dir": f"/run/zjc-bk-{tag}",
        "log_dir": str(root / "log"),
        "netns": netns,
        "bridge": "zjbr0",
        "subnet": "10.214.0.0/24",
        "nat": True,
        "uplink_cidr": "100.64.214.0/30",
        "uplink_netns": outside,
        "dns": ["198.51.100.1"],
        "launcher_command": [sys.executable, "-m", "zjusct_launcher"],
        "launcher_pythonpath": str(REPO / "launcher"),
        "stop_timeout_seconds": 90,
        "readiness_timeout_seconds": 900,
        "tcg_translation_cache_mib": 128,
        "max_concurrent_boots": TEST_BOOT_SLOTS,
        "boot_slot_dir": TEST_BOOT_SLOT_DIR,
        "volume_driver": "rbd",
        "rbd": {"pool": "rbd", "conf": str(ceph_cluster.conf), "user": "admin",
                "keyring_path": str(ceph_cluster.keyring)},
    }
    config_path = root / "host.json"
    config_path.write_text(json.dumps(config))
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cloud = Cloud(config_path, config, root, key)
    try:
        yield cloud
    finally:
        for vm_dir in (Path(config["state_dir"]) / "vms").glob("*"):
            ns_name, vm = vm_dir.name.split("_", 1)
            for pid in launcher_pids(cloud, vm, ns_name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        relay.close()
        for ns in (netns, outside):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(config["runtime_dir"], ignore_errors=True)
        for log in (root / "log").glob("*.log") if (root / "log").exists() else ():
            print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}")


def file_at(ceph_cluster: Cluster, image: str, path: str, work: Path) -> str:  # noqa: F811
    """Read one file from the ext4 root file system of an RBD image (rbd export + debugfs), without a guest."""
    raw = work / f"{image}.raw"
    subprocess.run(["rbd", "-c", str(ceph_cluster.conf), "export", "--no-progress", f"rbd/{image}", str(raw)],
                   check=True, capture_output=True, timeout=600, env=ceph_cluster.env())
    try:
        out = subprocess.run(["debugfs", "-R", f"cat {path}", str(raw)], check=True, capture_output=True,
                             text=True, timeout=120)
    finally:
        raw.unlink()
    return out.stdout


WATCHER_RE = re.compile(r"\d+\.\d+\.\d+\.\d+:\d+/\d+ \(client\.\d+\)")
