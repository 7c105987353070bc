"""Fixtures for tests on a real node (containerd + kubelet) of the test control plane.

* ``k8s_cluster`` (session): a control plane of its own, not the shared one of tests/integration/k8s: the real
  node's Node object changes what the scheduler reports to other tests ("0/3 nodes are available", one more
  tainted node). ``k8s_api`` and ``k8s_namespace`` are imported from tests/integration/k8s/conftest.py and resolve
  to this cluster here.
* ``real_node`` (session): :class:`tests.cluster.RealNode` joined to the session's control plane; torn down at
  session end, also when tests fail (its daemons die with the test process: PR_SET_PDEATHSIG). One per machine:
  a second session waits for the lock.
* ``launcher_image`` (session): ``playbooks/launcher_image.yml`` (cached archive under
  ``${ZJUSCT_CACHE}/launcher-image``) imported into the real node's containerd.
* ``pod_ceph`` (module; the cluster itself is the session's): a Ceph cluster bound to the host side of the real
  node's CNI bridge, the one host address a Pod reaches (for RBD root disks opened by QEMU's librbd inside launcher
  Pods); its OSD blocklist is cleared at each module's end.

Tests here are marked ``kubelet`` (and ``k8s``): under ``CI=true`` a missing containerd, runc or kubelet binary
fails them (tests/conftest.py gate).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.ceph import Cluster as CephCluster
from tests.ceph import start_cluster
from tests.cluster import Cluster, ClusterError, RealNode, RealNodeError, wait_for
from tests.conftest import require, require_real_node
from tests.integration.ceph.conftest import _have_ceph
from tests.integration.k8s.conftest import (  # noqa: F401  (fixtures re-exported for this directory)
    _k8s_component_gate,
    k8s_api,
    k8s_namespace,
    require_k8s_binaries,
)
from tests.integration.k8s_node.controller_helpers import image_archive
from tests.integration.k8s_node.test_real_node import busybox_pod

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """The real node's own control plane (stopped at session end, also when tests fail)."""
    require_k8s_binaries()
    cluster = Cluster(keep_state=bool(os.environ.get("ZJUSCT_K8S_KEEP")))
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"control plane did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_node(k8s_cluster: Cluster) -> Iterator[RealNode]:
    """A real node named ``real-node`` (Pods: spec fields from ``pod_placement()``: nodeSelector + toleration)."""
    require_real_node()
    node = RealNode(k8s_cluster.state_dir)
    try:
        node.start()
    except (RealNodeError, TimeoutError) as exc:
        pytest.fail(f"real node did not start: {exc}")
    try:
        yield node
    finally:
        node.stop()


def build_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory, kind: str) -> dict[str, Any]:
    """:func:`image_archive` of ``kind`` imported into the real node. Returns the playbook's report."""
    info = image_archive(tmp_path_factory.mktemp(f"{kind}-image"), kind)
    real_node.import_image(Path(info["archive"]))
    return info


@pytest.fixture(scope="session")
def launcher_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"tag", "archive", "key"}`` of the launcher image, imported into the real node."""
    return build_image(real_node, tmp_path_factory, "launcher")


# The Ceph cluster of RBD root disks binds the host side of the real node's CNI bridge (cni-zjusct0, 10.233.0.1, on
# the Pods' own subnet: the bridge plugin runs with isGateway but gives Pods no default route, so an address
# elsewhere on the host is out of their reach, measured: librbd "Connection timed out"). The bridge exists once the
# node has run a Pod; the fixture runs one first. The session's 127.0.0.1 cluster is out of a Pod's reach too.
CEPH_IF = "cni-zjusct0"  # zjusct_localcluster/node.py BRIDGE
CEPH_ADDR = "10.233.0.1"  # its host side (POD_GATEWAY), on-link for every Pod


def _bridge_has_address() -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", CEPH_IF], capture_output=True, text=True,
                         timeout=30, check=False)
    return f" {CEPH_ADDR}/" in out.stdout


@pytest.fixture(scope="session")
def _pod_ceph_cluster(real_node: RealNode, k8s_api: Any) -> Iterator[CephCluster]:  # noqa: F811
    """The session's Ceph cluster bound to ``CEPH_ADDR`` on the node's CNI bridge (stopped at the end; the bridge is
    the node's and goes with it). One per session: its start and the guest image's template import
    (``rbd_root_volume``) cost a minute or more of the lane that holds the machine's real-node lock; the tests name
    their images after their namespaces."""
    require("ceph", _have_ceph(), "ceph-mon/mgr/osd and rbd not installed (hack/install-deps.sh)")
    if not _bridge_has_address():  # the bridge plugin creates the bridge with the first Pod sandbox
        core: Any = client.CoreV1Api(k8s_api)
        core.create_namespaced_pod("default", busybox_pod(real_node, "bridge-up", "true"))
        try:
            wait_for(_bridge_has_address, 180, f"{CEPH_ADDR} on {CEPH_IF}")
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod("bridge-up", "default", grace_period_seconds=0)
    cluster = start_cluster(timeout=180, address=CEPH_ADDR)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def pod_ceph(_pod_ceph_cluster: CephCluster) -> Iterator[CephCluster]:
    """The session's Ceph for the Pods (``_pod_ceph_cluster``); at the module's end its OSD blocklist is cleared:
    a fence of a Pod IP with no watcher blocklists the whole address (``ip:0/0``), which would refuse a later
    module's launcher Pod given the same IP by the node's IPAM."""
    yield _pod_ceph_cluster
    with contextlib.suppress(Exception):
        _pod_ceph_cluster.ceph("osd", "blocklist", "clear")


SERVICE_BRIDGE = CEPH_IF  # the node's CNI bridge, where Pods' packets to the kubernetes Service arrive
NFT_TABLE = "zjusct_test_svc"


@pytest.fixture(scope="session")
def controller_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``playbooks/controller_image.yml`` imported into the real node once per session (see :func:`build_image`;
    the same archive for every module: one ``ctr images import`` of it costs 12-50 s)."""
    return build_image(real_node, tmp_path_factory, "controller")


@pytest.fixture(scope="module")
def service_route(k8s_cluster: Cluster, real_node: RealNode) -> Iterator[None]:
    """What kube-proxy would do here: DNAT the ``kubernetes`` Service address (10.96.0.1:443) arriving from the
    node's Pod bridge to the test API server on 127.0.0.1 (route_localnet); removed afterwards."""
    port = k8s_cluster.ports["kube-apiserver"]
    # conf/all: the bridge appears only with the first Pod (CNI); route_localnet is all-OR-device, restored below
    sysctl = Path("/proc/sys/net/ipv4/conf/all/route_localnet")
    before = sysctl.read_text().strip()
    rules = (f"table ip {NFT_TABLE} {{\n chain pre {{\n  type nat hook prerouting priority dstnat\n"
             f"  iifname \"{SERVICE_BRIDGE}\" ip daddr 10.96.0.1 tcp dport 443 dnat to 127.0.0.1:{port}\n }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    sysctl.write_text("1")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sysctl.write_text(before)
        subprocess.run(["nft", "delete", "table", "ip", NFT_TABLE], check=False)
