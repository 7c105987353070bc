"""What a real kubelet (tests/cluster/_realnode.py) does with the extended resource ``cloud.zjusct.io/bandwidth-mbps``
that the cluster role advertises (module zjusct.cloud.k8s_node_resources) and that no device plugin manages
(docs/controller.md "Bandwidth" states these facts; this test keeps them true across kubelet upgrades):

* it keeps it (capacity and allocatable) across a kubelet restart: the Node object is reused;
* it zeroes it when, at start, its device-plugin directory is empty (the kubelet takes that for a recreated
  node: a reinstalled machine, a wiped /var/lib/kubelet);
* a Node object deleted and registered again comes back without it;
* after either, running the module again (what re-running the role does) restores it.

No guest boots; three kubelet restarts (about a minute).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils._node_resources import run
from kubernetes import client

from tests.cluster import BANDWIDTH_RESOURCE, Cluster, RealNode, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.timeout(900)]
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")  # fixed in the kubelet, whatever its --root-dir


def _advertised(core: Any, node: str) -> tuple[str | None, str | None]:
    status = core.read_node(node).status
    return (status.capacity or {}).get(BANDWIDTH_RESOURCE), (status.allocatable or {}).get(BANDWIDTH_RESOURCE)


def _advertise(core: Any, node: str, mbps: int) -> dict[str, Any]:
    return run({"name": node, "resources": {BANDWIDTH_RESOURCE: mbps}, "state": "present"}, False, core=core)


def test_the_kubelet_keeps_the_bandwidth_across_a_restart_and_loses_it_when_the_node_is_recreated(
        k8s_cluster: Cluster, real_node: RealNode) -> None:
    core: Any = client.CoreV1Api(k8s_cluster.api_client())
    node = real_node.name
    try:
        assert _advertise(core, node, 100)["changed"] is True
        assert _advertised(core, node) == ("100", "100")

        real_node.restart_kubelet()
        assert _advertised(core, node) == ("100", "100")
        assert "Zero out resource capacity" not in real_node.kubelet_log.read_text(errors="replace")
        assert _advertise(core, node, 100)["changed"] is False  # nothing for the role to do

        def empty_device_plugin_dir() -> None:  # what a wiped /var/lib/kubelet looks like to the kubelet
            for entry in DEVICE_PLUGINS.iterdir():
                entry.unlink()

        real_node.restart_kubelet(between=empty_device_plugin_dir)
        assert _advertised(core, node) == ("0", "0")
        assert "Zero out resource capacity" in real_node.kubelet_log.read_text(errors="replace")
        assert _advertise(core, node, 100)["changed"] is True
        assert _advertised(core, node) == ("100", "100")

        def delete_node() -> None:
            core.delete_node(node)
            wait_for(lambda: node not in {n.metadata.name for n in core.list_node().items}, 60, "Node deleted")

        real_node.restart_kubelet(between=delete_node)
        assert _advertised(core, node) == (None, None)
        assert _advertise(core, node, 100)["changed"] is True
        assert _advertised(core, node) == ("100", "100")
    finally:  # leave the session's real node as it was
        run({"name": node, "resources": {BANDWIDTH_RESOURCE: 0}, "state": "absent"}, False, core=core)
