"""The local cluster's pure parts (zjusct_localcluster): node addressing and its validation, the agents' command
lines, the Pod pieces for Ceph clients. The real cluster is tested in tests/integration/localcluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from zjusct_localcluster import hostnet
from zjusct_localcluster.cluster import LocalCluster, ceph_in_pod
from zjusct_localcluster.nsnode import LOSS_MODES, NamespacedNode


def test_addressing_of_three_nodes() -> None:
    nodes = hostnet.node_addressing(3)
    assert [(n.name, n.ip, n.pod_cidr, n.pod_gateway) for n in nodes] == [
        ("node-1", "10.240.0.11", "10.244.1.0/24", "10.244.1.1"),
        ("node-2", "10.240.0.12", "10.244.2.0/24", "10.244.2.1"),
        ("node-3", "10.240.0.13", "10.244.3.0/24", "10.244.3.1"),
    ]
    n = nodes[1]
    assert (n.netns, n.veth, n.cgroup) == ("zjnode-node-2", "zjn-node-2", "zjnode-node-2")
    assert n.enter() == ["nsenter", "--net=/run/netns/zjnode-node-2",
                         "--mount=/run/zjusct-localcluster/node-2.mnt", "--"]


@pytest.mark.parametrize("count", [0, 4, 10])
def test_node_count_outside_the_range_names_the_option(count: int) -> None:
    with pytest.raises(ValueError, match=rf"--nodes {count}: must be 1\.\.3"):
        hostnet.node_addressing(count)


@pytest.mark.parametrize("name", ["Node1", "a-very-long-name", "-x", "x_y", ""])
def test_node_names_that_cannot_name_an_interface_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="node name"):
        hostnet.NodeAddressing(name, 1)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        hostnet.node_addressing(2, ["a", "a"])


def test_local_cluster_validates_before_it_touches_anything(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--nodes 4"):
        LocalCluster(state_dir=tmp_path / "s", nodes=4)
    with pytest.raises(ValueError, match="--ceph-osds 0"):
        LocalCluster(state_dir=tmp_path / "s", ceph_osds=0)
    assert not (tmp_path / "s").exists()


def test_kube_router_runs_only_its_network_policy_controller(tmp_path: Path) -> None:
    a = hostnet.node_addressing(2)
    node = NamespacedNode(tmp_path, a[0], a, work_dir=tmp_path / "n")
    argv = node._kube_router_argv()
    assert {"--run-firewall=true", "--run-router=false", "--run-service-proxy=false"} <= set(argv)
    assert "--hostname-override=node-1" in argv
    with pytest.raises(ValueError, match="how='unplug': must be one of poweroff, agents, partition"):
        node.lose("unplug")
    assert set(LOSS_MODES) == {"poweroff", "agents", "partition"}


def test_ceph_clients_in_a_pod_get_the_hosts_usr_read_only() -> None:
    pieces = ceph_in_pod("/state/zceph-x/client")
    mounts = {m["mountPath"]: m for m in pieces["volumeMounts"]}
    assert set(mounts) == {"/usr", "/lib", "/lib64", "/etc/ceph"}
    assert all(m["readOnly"] for m in mounts.values())
    paths = {v["name"]: v["hostPath"]["path"] for v in pieces["volumes"]}
    assert paths == {"usr": "/usr", "lib": "/usr/lib", "lib64": "/usr/lib64", "ceph": "/state/zceph-x/client"}
