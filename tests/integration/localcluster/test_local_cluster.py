"""The local cluster on this machine (zjusct_localcluster.LocalCluster, what ``hack/cluster.sh up`` runs): two real
nodes in their own namespaces, Pods across them, kube-proxy Services (the API server's too), kube-router enforcing
a NetworkPolicy, Ceph reached from Pods, and a node lost and restored.

Each test makes its own Pods in its own namespace and waits for the very state it asserts.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from zjusct_localcluster import hostnet
from zjusct_localcluster.cluster import LocalCluster, ceph_in_pod

from tests.cluster import RealNode, wait_for
from tests.integration.localcluster.conftest import (
    MARK,
    WAIT,
    busybox_pod,
    exec_in,
    finished_pod,
    http_probe,
    running_pod,
    server_script,
)

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.multinode]


def test_both_nodes_ready_each_in_its_own_namespace(local_cluster: LocalCluster, lc_core: Any) -> None:
    assert local_cluster.node_names == ["node-1", "node-2"]
    for index, name in enumerate(local_cluster.node_names, start=1):
        node = local_cluster.wait_node(name, ready=True, timeout=WAIT)
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == f"10.240.0.{10 + index}"
        assert node.status.node_info.kubelet_version == "v1.35.4"
        assert not node.spec.taints
        running = local_cluster.node(name).running()
        assert running == {"containerd": True, "kubelet": True, "kube-proxy": True, "kube-router": True,
                           "link": True}, running
        # the node's own network namespace: its eth0 holds the node IP, the host does not
        netns_addrs = subprocess.run(["ip", "-n", f"zjnode-{name}", "-4", "-o", "addr"], capture_output=True,
                                     text=True, check=True).stdout
        assert f"10.240.0.{10 + index}/24" in netns_addrs
    host_addrs = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert "10.240.0.11/" not in host_addrs and f"{hostnet.HOST_IP}/24" in host_addrs


@pytest.fixture
def server_and_client(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str) -> tuple[Any, Any]:
    """An HTTP server Pod on node-2 and a client Pod on node-1."""
    server = running_pod(lc_core, lc_namespace, busybox_pod(local_cluster, "node-2", "server", server_script()))
    client_pod = running_pod(lc_core, lc_namespace,
                             busybox_pod(local_cluster, "node-1", "client", "exec sleep 3600"))
    assert server.spec.node_name == "node-2" and client_pod.spec.node_name == "node-1"
    assert server.status.pod_ip.startswith("10.244.2.") and client_pod.status.pod_ip.startswith("10.244.1.")
    return server, client_pod


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP server on the host bridge's address answering ``hello-from-host``; yields its port."""
    srv = socket.create_server((hostnet.HOST_IP, 0))
    srv.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                with conn:
                    conn.sendall(b"hello-from-host\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        srv.close()


def test_pod_to_pod_across_nodes_and_pod_to_host(local_cluster: LocalCluster, server_and_client: tuple[Any, Any],
                                                 lc_core: Any, lc_namespace: str, host_listener: int) -> None:
    server, client_pod = server_and_client
    got = wait_for(lambda: MARK in (r := http_probe(lc_core, lc_namespace, "client", server.status.pod_ip, 8080))
                   and r, WAIT, "node-1's Pod reaching node-2's Pod")
    assert "server" in got
    # and the reverse direction, node-2 -> node-1 (the client Pod answers nothing: a refused connection still
    # proves the route; nc prints nothing, so ping the Pod IP instead)
    out = exec_in(lc_core, lc_namespace, "server", f"ping -c 1 -W 3 {client_pod.status.pod_ip} && echo PING-OK")
    assert "PING-OK" in out, out
    # Pod -> the host (the bridge address where kube-apiserver and Ceph listen)
    out = exec_in(lc_core, lc_namespace, "client", f"nc -w 3 {hostnet.HOST_IP} {host_listener} </dev/null")
    assert "hello-from-host" in out, out
    # the host -> a Pod (routed to node-2 over the bridge; the host forwards nothing)
    with socket.create_connection((server.status.pod_ip, 8080), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert MARK.encode() in conn.makefile("rb").read()
    # ... and never turns forwarding on for that (each node forwards inside its own namespace)
    assert hostnet.read_sysctls(("net.ipv4.ip_forward",)) == local_cluster.host_ip_forward_before


def test_cluster_ip_service_through_kube_proxy(server_and_client: tuple[Any, Any], lc_core: Any,
                                              lc_namespace: str) -> None:
    svc = lc_core.create_namespaced_service(lc_namespace, {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
    })
    ip = svc.spec.cluster_ip
    assert ip.startswith("10.96.")
    got = wait_for(lambda: MARK in (r := http_probe(lc_core, lc_namespace, "client", ip, 80)) and r, WAIT,
                   f"Service {ip}:80 from node-1 to the Pod on node-2")
    assert "server" in got


def test_the_api_servers_service_from_a_pod(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str) -> None:
    """In-cluster config as a controller Deployment uses it: KUBERNETES_SERVICE_HOST (10.96.0.1, kube-proxy's
    DNAT to the API server on the host bridge), TLS verified with the ServiceAccount's CA."""
    script = ("import json,os,ssl,urllib.request\n"
              "ctx=ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
              "url='https://%s:%s/version'%(os.environ['KUBERNETES_SERVICE_HOST'],"
              "os.environ['KUBERNETES_SERVICE_PORT'])\n"
              "print(url, json.load(urllib.request.urlopen(url,context=ctx,timeout=20))['gitVersion'])\n")
    mounts = ceph_in_pod("/nonexistent")
    volumes = [v for v in mounts["volumes"] if v["name"] != "ceph"]
    volume_mounts = [m for m in mounts["volumeMounts"] if m["name"] != "ceph"]
    for node in local_cluster.node_names:
        pod, log = finished_pod(lc_core, lc_namespace, busybox_pod(
            local_cluster, node, f"api-{node}", f"exec /usr/bin/python3 -c \"{script}\"", volumes=volumes,
            container={"volumeMounts": volume_mounts}))
        assert pod.status.phase == "Succeeded", log
        assert "https://10.96.0.1:443/version v1.35.4" in log, log


def _policy(ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "server-ingress"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
                     "ingress": ingress}}


def test_network_policy_enforced_across_nodes_by_kube_router(local_cluster: LocalCluster,
                                                             server_and_client: tuple[Any, Any], lc_core: Any,
                                                             lc_namespace: str) -> None:
    server, _ = server_and_client
    running_pod(lc_core, lc_namespace, busybox_pod(local_cluster, "node-1", "other", "exec sleep 3600"))
    ip = server.status.pod_ip
    for pod in ("client", "other"):
        wait_for(lambda p=pod: MARK in http_probe(lc_core, lc_namespace, p, ip, 8080), WAIT, f"{pod} before policy")
    net: Any = client.NetworkingV1Api(local_cluster.api_client())
    net.create_namespaced_network_policy(lc_namespace, _policy([]))  # deny every ingress to the server

    def blocked(pod: str) -> bool:  # three probes in a row: a policy half synced does not count
        return all(MARK not in http_probe(lc_core, lc_namespace, pod, ip, 8080) for _ in range(3))

    wait_for(lambda: blocked("client") and blocked("other"), WAIT, "the deny policy enforced on node-2")
    net.replace_namespaced_network_policy("server-ingress", lc_namespace, _policy(
        [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 8080}]}]))
    wait_for(lambda: MARK in http_probe(lc_core, lc_namespace, "client", ip, 8080), WAIT,
             "the client allowed again")
    assert blocked("other"), "a Pod the policy does not allow reached the server"


def test_pods_on_every_node_reach_ceph(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str) -> None:
    ceph = local_cluster.ceph
    assert ceph is not None
    osd = json.loads(ceph.ceph("osd", "stat", "--format", "json"))
    assert osd["num_up_osds"] == 3 and osd["num_in_osds"] == 3, osd
    image = f"probe-{uuid.uuid4().hex[:6]}"
    subprocess.run(["rbd", "-c", str(ceph.conf), "create", "--size", "4", f"rbd/{image}"], check=True, timeout=60)
    try:
        mounts = ceph_in_pod(str(ceph.client_dir()))
        for node in local_cluster.node_names:
            pod, log = finished_pod(lc_core, lc_namespace, busybox_pod(
                local_cluster, node, f"rbd-{node}", "exec /usr/bin/rbd ls rbd", volumes=mounts["volumes"],
                container={"volumeMounts": mounts["volumeMounts"]}))
            assert pod.status.phase == "Succeeded", log
            assert image in log.split(), log
    finally:
        subprocess.run(["rbd", "-c", str(ceph.conf), "rm", f"rbd/{image}"], check=False, timeout=60,
                       capture_output=True)


def test_node_lost_then_restored(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str) -> None:
    """``lose_node`` (power off: agents, shims and containers killed, link cut) -> NotReady + unreachable taint while
    the other node stays Ready; ``restore_node`` -> Ready, and a new Pod runs there."""
    running_pod(lc_core, lc_namespace, busybox_pod(local_cluster, "node-2", "victim", "exec sleep 3600"))
    local_cluster.lose_node("node-2", how="poweroff")
    try:
        lost = local_cluster.wait_node("node-2", ready=False, timeout=WAIT)
        effects = {t.key: t.effect for t in lost.spec.taints if t.key == "node.kubernetes.io/unreachable"}
        assert effects, lost.spec.taints
        assert local_cluster.node("node-2").running() == {"containerd": False, "kubelet": False,
                                                          "kube-proxy": False, "kube-router": False, "link": False}
        assert not hostnet.cgroup_pids(local_cluster.node("node-2").addressing)  # its containers are gone
        local_cluster.wait_node("node-1", ready=True, timeout=WAIT)
    finally:
        local_cluster.restore_node("node-2", timeout=WAIT)
    local_cluster.wait_node("node-2", ready=True, timeout=WAIT)
    pod, log = finished_pod(lc_core, lc_namespace, busybox_pod(local_cluster, "node-2", "after", "echo back"))
    assert pod.status.phase == "Succeeded" and "back" in log


def test_a_single_real_node_waits_for_the_local_cluster(local_cluster: LocalCluster) -> None:
    """The local cluster holds the machine lock a tests.cluster RealNode takes (both use kubelet's fixed host
    paths): a real node started meanwhile times out naming the cluster, and leaves nothing."""
    assert local_cluster.control_plane is not None
    single = RealNode(local_cluster.control_plane.state_dir, name="single", lock_timeout=1)
    with pytest.raises(TimeoutError, match=f"local cluster {local_cluster.state_dir}"):
        single.start()
    assert not single.work.exists()
