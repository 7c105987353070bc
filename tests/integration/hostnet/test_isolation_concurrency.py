"""Concurrent VM starts on one host each update the isolation table; none may undo another's update.

Reported as a race: every start commits its lease and then makes ``bridge zjusct_isolation`` match the store
(:func:`host.network.sync_isolation`). Two starts that read the store before either applied could
each apply an older view; the diff of the later one then deletes the element the other just added, and that
guest is cut off from its own owner's other guests (``same_owner``) while its MAC/IPv4 checks are missing.
With reads outside the lock this test loses the last start's elements every time (the slow listings below
widen the window as a loaded host does).
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import sync_isolation
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

pytestmark = pytest.mark.netns

SUBNET = "10.218.0.0/24"
STARTS = 12


@pytest.fixture
def cloud(tmp_path):
    cfg = HostConfig(netns=f"zjc-ic-{uuid.uuid4().hex[:6]}", state_dir=str(tmp_path / "state"),
                     store_path=str(tmp_path / "store.db"), subnet=SUBNET, bridge="zjbr0")
    try:
        net.ensure_bridge(cfg.netns, cfg.bridge, cfg.subnet)
        yield cfg
    finally:
        subprocess.run(["ip", "netns", "del", cfg.netns], capture_output=True, check=False)


def start(cfg: HostConfig, index: int, gate: threading.Barrier, errors: list) -> None:
    """What a VM start does to the network records: commit a lease, then sync the table (own store handle)."""
    try:
        with HostStore(cfg.store_path) as store:
            owner = "alice" if index % 2 else "bob"
            gate.wait(timeout=60)
            time.sleep(0.05 * index)
            vm = store.create_vm("default", f"vm{index}", {"owner": owner})
            store.put_lease({"ipv4": f"10.218.0.{index + 2}", "vm_uid": vm["metadata"]["uid"],
                             "mac": f"52:54:00:00:00:{index + 2:02x}", "tap": f"zjtic{index:04d}"})
            sync_isolation(cfg, store)
    except Exception as exc:  # reported by the test, with the thread's index
        errors.append((index, exc))


def test_concurrent_starts_leave_every_guest_in_the_isolation_sets(cloud, monkeypatch):
    # A loaded host: for every other start, listing the table takes a while, so a start that read the store
    # early applies its diff after a later start applied its own (the window in which an unserialised start
    # undoes another's elements). Starts commit one after another, 50 ms apart.
    listing = net._nft_elements

    def slow_listing(netns):
        if int(threading.current_thread().name.split("-")[1]) % 2 == 0:
            time.sleep(0.3)
        return listing(netns)

    monkeypatch.setattr(net, "_nft_elements", slow_listing)
    with HostStore(cloud.store_path):
        pass  # the schema exists before the starts race
    gate, errors = threading.Barrier(STARTS), []
    threads = [threading.Thread(target=start, args=(cloud, i, gate, errors), name=f"start-{i}")
               for i in range(STARTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with HostStore(cloud.store_path) as store:
        groups = {}
        owners = {vm["metadata"]["uid"]: vm["spec"]["owner"] for vm in store.list_vms()}
        for lease in store.leases():
            groups.setdefault(owners[lease["vm_uid"]], []).append(lease)
    assert sum(len(g) for g in groups.values()) == STARTS
    current = listing(cloud.netns)
    assert current is not None, "the isolation table is missing"
    wanted = net.isolation_elements(groups)
    for name in net.ISOLATION_SETS:
        missing = wanted[name] - current[name]
        assert not missing, f"set {name} lost the elements of concurrent starts: {sorted(missing)}"
