"""Fixtures for the local cluster (zjusct_localcluster, docs/kubernetes.md): two real nodes in their own network and
mount namespaces, kube-proxy, kube-router, and Ceph with three OSDs, all on this machine.

* ``local_cluster`` (package): a :class:`zjusct_localcluster.cluster.LocalCluster` — the same class
  ``hack/cluster.sh up`` runs — started once for the modules of this directory that use it and stopped after the
  last of them (also when tests fail; its daemons die with the test process). It takes the machine's real-node lock
  for that time, so tests/conftest.py runs the modules that bring up a cluster of their own (``hack/cluster.sh``,
  ``make quickstart-kubernetes``) before it. A test that loses a node restores it; ``lc_namespace`` waits for every
  node Ready.
* ``lc_core`` / ``lc_namespace``: the admin CoreV1Api and a fresh namespace (Pods force-deleted after the test).
* helpers to make busybox Pods on a given node and to run a command in one.

Tests here are marked ``multinode`` (and ``kubelet``, ``ceph``, ``k8s``): under ``CI=true`` a missing binary or
package fails them (tests/conftest.py gate).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from zjusct_localcluster.cluster import LocalCluster, LocalClusterError, missing_reason
from zjusct_localcluster.hostnet import read_sysctls

from tests.cluster import wait_for
from tests.conftest import require
from tests.integration.controller_process import release_launcher_pods

# A probe over a cut or filtered path waits for nc's own timeout; everything else returns as soon as it holds.
WAIT = 180.0
MARK = "hello-from-server"


@pytest.fixture(scope="package")
def local_cluster() -> Iterator[LocalCluster]:
    """Two nodes and a three-OSD Ceph, shared by the package's modules (node-loss tests change it and restore
    it)."""
    reason = missing_reason()
    require("multinode", reason is None, f"a local cluster needs {reason}")
    parent = Path(tempfile.mkdtemp(prefix="zjlc-"))  # short: containerd's sockets live under it (107 bytes)
    cluster = LocalCluster(state_dir=parent / "s", nodes=2, ceph=True, ceph_osds=3,
                           keep_state=bool(os.environ.get("ZJUSCT_K8S_KEEP")))
    cluster.host_ip_forward_before = read_sysctls(("net.ipv4.ip_forward",))  # type: ignore[attr-defined]
    try:
        cluster.start()
    except (LocalClusterError, TimeoutError) as exc:
        pytest.fail(f"local cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="package")
def lc_core(local_cluster: LocalCluster) -> Iterator[Any]:
    api = local_cluster.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def lc_namespace(local_cluster: LocalCluster, lc_core: Any) -> Iterator[str]:
    """A fresh namespace with its ``default`` ServiceAccount; every node Ready first (a node-loss test may have run
    just before)."""
    for name in local_cluster.node_names:
        local_cluster.wait_node(name, ready=True, timeout=WAIT)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    lc_core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: lc_core.read_namespaced_service_account("default", ns), WAIT, f"ServiceAccount {ns}/default")
    try:
        yield ns
    finally:
        with contextlib.suppress(ApiException):
            for pod in lc_core.list_namespaced_pod(ns).items:
                lc_core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
            release_launcher_pods(lc_core, ns)  # those no controller released (a test's node still lost)
            lc_core.delete_namespace(ns)


def busybox_pod(cluster: LocalCluster, node: str, name: str, script: str, labels: dict[str, str] | None = None,
                **spec: Any) -> dict[str, Any]:
    """A busybox Pod on ``node`` running ``script`` under ``sh -c``."""
    image = str(cluster.node(node).images["busybox"])
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {**cluster.pod_placement(node), "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [container], **spec},
    }


def server_script() -> str:
    """busybox httpd on port 8080 serving :data:`MARK` and the Pod's hostname."""
    return f'mkdir -p /tmp/www && echo "{MARK} $(hostname)" > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www'


def running_pod(core: Any, ns: str, manifest: dict[str, Any]) -> Any:
    """Create ``manifest`` and wait until it is Running with an IP; return the Pod."""
    core.create_namespaced_pod(ns, manifest)
    name = manifest["metadata"]["name"]

    def running() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase == "Running" and pod.status.pod_ip else None

    return wait_for(running, WAIT, f"pod {ns}/{name} Running")


def finished_pod(core: Any, ns: str, manifest: dict[str, Any]) -> tuple[Any, str]:
    """Create ``manifest``, wait until it has ended; return the Pod and its log."""
    core.create_namespaced_pod(ns, manifest)
    name = manifest["metadata"]["name"]

    def ended() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_for(ended, WAIT, f"pod {ns}/{name} finished")
    return pod, core.read_namespaced_pod_log(name, ns)


def exec_in(core: Any, ns: str, pod: str, script: str) -> str:
    """Run ``sh -c script`` in the Pod's container through the API server (kubelet exec); return its output."""
    out = stream(core.connect_get_namespaced_pod_exec, pod, ns, command=["/bin/sh", "-c", script],
                 stderr=True, stdin=False, stdout=True, tty=False, _request_timeout=60)
    return str(out)


def http_probe(core: Any, ns: str, pod: str, ip: str, port: int) -> str:
    """From Pod ``pod``, an HTTP/1.0 GET to ``ip:port`` with busybox nc (3 s timeout); the response or ''."""
    return exec_in(core, ns, pod, f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} {port} || true")
