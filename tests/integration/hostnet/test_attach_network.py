"""A start's Network.attach (host/ports.py HostNetwork) on a real namespace: it makes the cloud's network when the
bridge is missing (first start, or after a host restart removed the namespace), and otherwise leaves what site.yml
made alone while still putting the TAP on the bridge and syncing isolation."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import ensure_network
from ansible_collections.zjusct.cloud.plugins.module_utils.host.ports import HostNetwork
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

pytestmark = pytest.mark.netns


@pytest.fixture
def cloud(tmp_path):
    tag = uuid.uuid4().hex[:6]
    outside = f"zjc-ao-{tag}"
    subprocess.run(["ip", "netns", "add", outside], check=True)
    cfg = HostConfig(netns=f"zjc-an-{tag}", state_dir=str(tmp_path / "state"), store_path=str(tmp_path / "s.db"),
                     subnet="10.217.0.0/24", bridge="zjbr0", nat=True, uplink_cidr="100.64.217.0/30",
                     uplink_netns=outside)
    try:
        yield cfg
    finally:
        for ns in (cfg.netns, outside):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _lease(store: HostStore, name: str, address: str) -> dict:
    vm = store.create_vm("default", name, {"owner": "alice"})
    uid = vm["metadata"]["uid"]
    lease = {"ipv4": address, "vm_uid": uid, "mac": net.mac_address(uid), "tap": net.tap_name(uid)}
    store.put_lease(lease)
    return lease


def _isolated_macs(cfg: HostConfig) -> str:
    return subprocess.run(["ip", "netns", "exec", cfg.netns, "nft", "list", "ruleset"], capture_output=True,
                          text=True, check=True).stdout


def test_attach_makes_the_network_when_the_bridge_is_missing_and_again_after_a_restart(cloud):
    with HostStore(cloud.store_path) as store:
        first = _lease(store, "vm1", "10.217.0.2")
        HostNetwork(cloud, store).attach(first)
        assert net.link_exists(cloud.netns, cloud.bridge)
        assert net.link_exists(cloud.netns, net.UPLINK_INNER)
        assert net.link_exists(cloud.netns, first["tap"])
        assert ensure_network(cloud) is False, "attach left the network incomplete"
        # a host restart: the namespace and everything in it are gone
        subprocess.run(["ip", "netns", "del", cloud.netns], check=True)
        HostNetwork(cloud, store).attach(first)
        assert net.link_exists(cloud.netns, cloud.bridge)
        assert net.link_exists(cloud.netns, first["tap"])
        assert ensure_network(cloud) is False, "attach after a restart left the network incomplete"


def test_attach_with_the_network_in_place_adds_the_tap_and_its_isolation(cloud):
    ensure_network(cloud)  # what site.yml's host_network task did
    with HostStore(cloud.store_path) as store:
        lease = _lease(store, "vm2", "10.217.0.3")
        HostNetwork(cloud, store).attach(lease)
        assert net.link_exists(cloud.netns, lease["tap"])
        assert lease["mac"] in _isolated_macs(cloud), "the new lease is not in the isolation sets"
        assert ensure_network(cloud) is False
