"""Node objects without a kubelet: registration, heartbeat (Lease + Ready condition) and Pod status.

There is no kubelet and no container runtime in the test control plane. The harness plays the
kubelet's API role instead, with each node's own identity (``system:node:<name>`` in group
``system:nodes``, authorized by the Node authorizer):

* :class:`Heartbeat` renews ``kube-node-lease/<node>`` and the node's Ready condition, so
  kube-controller-manager's node lifecycle controller keeps the node Ready and untainted. Pausing
  one node (a marker file, see :func:`pause_marker`) simulates a lost node: after
  ``--node-monitor-grace-period`` the controller sets Ready=Unknown and taints the node.
* :class:`Kubelet` writes Pod status the way a kubelet reports it (Running, then terminated), for
  tests that need a Pod to "have run". Nothing actually runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

# The controller's decide.BANDWIDTH_RESOURCE, written again here: this package imports no collection code
# (tests/unit/module_utils/test_api_keys_once.py holds the two equal).
BANDWIDTH_RESOURCE = "cloud.zjusct.io/bandwidth-mbps"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
STATUS_REPORT_SECONDS = 60.0  # a kubelet with leases reports unchanged status every 5 min; we are stricter


@dataclass(frozen=True)
class NodeSpec:
    """Capacity and identity of one registered Node (all quantities in Kubernetes notation).

    Attributes:
        name: Node name (also the ``kubernetes.io/hostname`` label).
        address: InternalIP reported in status (a loopback address: nothing listens there).
        cpu: CPU capacity in cores.
        memory: memory capacity (e.g. ``32Gi``).
        ephemeral_storage: ephemeral-storage capacity.
        pods: maximum Pod count.
        bandwidth_mbps: capacity of the extended resource ``cloud.zjusct.io/bandwidth-mbps`` in Mbit/s.
        labels: extra labels.
    """

    name: str
    address: str
    cpu: str = "8"
    memory: str = "32Gi"
    ephemeral_storage: str = "100Gi"
    pods: str = "110"
    bandwidth_mbps: int = 1000
    labels: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        """The node's capacity (also used as allocatable: no system reservation)."""
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "ephemeral-storage": self.ephemeral_storage,
            "pods": self.pods,
            BANDWIDTH_RESOURCE: str(self.bandwidth_mbps),
        }


DEFAULT_NODES: tuple[NodeSpec, ...] = (
    NodeSpec(name="node-a", address="127.0.10.1"),
    NodeSpec(name="node-b", address="127.0.10.2"),
)


def rfc3339(now: dt.datetime | None = None, *, micro: bool = False) -> str:
    """Format ``now`` (default: current UTC time) as RFC 3339, with microseconds if ``micro``."""
    now = now or dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def node_conditions(now: str) -> list[dict[str, str]]:
    """The healthy-node conditions a kubelet reports, with heartbeat time ``now`` (RFC 3339)."""
    healthy = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": "heartbeat from tests/cluster (no kubelet)",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, s, r in healthy
    ]


def node_manifest(spec: NodeSpec, k8s_version: str) -> dict[str, Any]:
    """The Node object registered for ``spec``, status included (as a kubelet registers itself)."""
    now = rfc3339()
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "cloud.zjusct.io/test-node": "true",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": spec.capacity(),
            "allocatable": spec.capacity(),
            "conditions": node_conditions(now),
            "addresses": [
                {"type": "InternalIP", "address": spec.address},
                {"type": "Hostname", "address": spec.name},
            ],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "zjusct.cloud test node (no kubelet)",
                "containerRuntimeVersion": "none://0",
                "kubeletVersion": f"v{k8s_version}",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def pause_marker(state_dir: Path, node: str) -> Path:
    """The file whose existence makes :class:`Heartbeat` skip ``node`` (simulated node loss)."""
    return state_dir / "heartbeat" / f"paused-{node}"


class Heartbeat:
    """Renews every node's Lease each ``interval`` seconds and its conditions when due, as a kubelet would.

    Args:
        clients: ``{node name: ApiClient}``, each authenticated as that node (``system:node:<name>``).
        state_dir: cluster state directory; ``pause_marker(state_dir, node)`` pauses a node.
        interval: seconds between two beats.
    """

    def __init__(self, clients: dict[str, client.ApiClient], state_dir: Path, interval: float = 2.0) -> None:
        self.clients = clients
        self.state_dir = state_dir
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        (state_dir / "heartbeat").mkdir(parents=True, exist_ok=True)
        self.last_error: str | None = None
        self._reported: dict[str, float] = {}

    def beat(self, node: str) -> None:
        """Renew ``node``'s Lease (creating it if needed) and, when due, its node conditions, once.

        Raises:
            kubernetes.client.exceptions.ApiException: the API server refused a request.
        """
        api = self.clients[node]
        coord: Any = client.CoordinationV1Api(api)
        now_micro = rfc3339(micro=True)
        try:
            coord.patch_namespaced_lease(
                node,
                LEASE_NAMESPACE,
                {"spec": {"holderIdentity": node, "renewTime": now_micro}},
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            node_obj: Any = client.CoreV1Api(api).read_node(node)
            coord.create_namespaced_lease(
                LEASE_NAMESPACE,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": node,
                        "namespace": LEASE_NAMESPACE,
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_obj.metadata.uid}
                        ],
                    },
                    "spec": {
                        "holderIdentity": node,
                        "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                        "renewTime": now_micro,
                    },
                },
            )
        self._report_status(node)

    def _report_status(self, node: str) -> None:
        """Write the node conditions when Ready is not True (e.g. after a simulated loss) or the last
        report is older than ``STATUS_REPORT_SECONDS``; like a kubelet, keep transition times otherwise."""
        core: Any = client.CoreV1Api(self.clients[node])
        current = {c.type: c for c in (core.read_node(node).status.conditions or [])}
        ready = current.get("Ready")
        fresh = time.monotonic() - self._reported.get(node, -STATUS_REPORT_SECONDS) < STATUS_REPORT_SECONDS
        if ready is not None and ready.status == "True" and fresh:
            return
        conditions = node_conditions(rfc3339())
        for cond in conditions:
            old = current.get(cond["type"])
            if old is not None and old.status == cond["status"] and old.last_transition_time:
                cond["lastTransitionTime"] = rfc3339(old.last_transition_time)
        core.patch_node_status(node, {"status": {"conditions": conditions}})
        self._reported[node] = time.monotonic()

    def beat_all(self) -> None:
        """One beat for every node that is not paused; errors are logged and kept in ``last_error``."""
        for node in self.clients:
            if pause_marker(self.state_dir, node).exists():
                continue
            try:
                self.beat(node)
            except Exception as exc:  # keep beating the other nodes; the API server may be restarting
                self.last_error = f"{node}: {exc}"
                log.warning("heartbeat for %s failed: %s", node, exc)

    def run(self) -> None:
        """Beat until :meth:`stop` is called (blocking)."""
        while not self._stop.is_set():
            self.beat_all()
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Run :meth:`run` in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="k8s-node-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop beating and wait up to ``timeout`` seconds for the thread to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class Kubelet:
    """Writes Pod status as the kubelet of ``node`` would, with the node's own identity.

    Nothing runs: this only lets tests observe the API-level life of a Pod (Running, then
    Succeeded/Failed with a termination message). The Node authorizer plus the NodeRestriction
    admission plugin only let a node write the status of Pods bound to it, so using the wrong node
    fails (403) like a misbehaving kubelet would.

    Args:
        api: ApiClient authenticated as ``system:node:<node>``.
        node: the node name.
        node_ip: the node's InternalIP (reported as ``hostIP``).
    """

    def __init__(self, api: client.ApiClient, node: str, node_ip: str) -> None:
        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.node = node
        self.node_ip = node_ip

    def _pod(self, namespace: str, name: str) -> Any:
        # as a kubelet does: only Pods selected by spec.nodeName=<this node> are visible to a node
        pods: Any = self.core.list_namespaced_pod(
            namespace, field_selector=f"spec.nodeName={self.node},metadata.name={name}"
        )
        if not pods.items:
            raise ValueError(f"pod {namespace}/{name} is not bound to {self.node!r}")
        return pods.items[0]

    def mark_running(self, namespace: str, name: str, pod_ip: str = "10.244.0.10") -> Any:
        """Report every container of the Pod as started and ready; phase Running.

        Raises:
            ValueError: the Pod is not bound to this node.
            kubernetes.client.exceptions.ApiException: the API server refused the update.
        """
        pod = self._pod(namespace, name)
        now = rfc3339()
        statuses = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        conditions = [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
        ]
        body = {
            "status": {
                "phase": "Running",
                "hostIP": self.node_ip,
                "hostIPs": [{"ip": self.node_ip}],
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "startTime": now,
                "conditions": conditions,
                "containerStatuses": statuses,
            }
        }
        return self.core.patch_namespaced_pod_status(name, namespace, body)

    def mark_terminated(
        self, namespace: str, name: str, exit_code: int = 0, reason: str = "Completed", message: str = ""
    ) -> Any:
        """Report every container as terminated with ``exit_code`` and termination ``message``.

        The phase becomes Succeeded for exit code 0, Failed otherwise (``restartPolicy: Never`` semantics).

        Raises:
            ValueError: the Pod is not bound to this node.
            kubernetes.client.exceptions.ApiException: the API server refused the update.
        """
        pod = self._pod(namespace, name)
        now = rfc3339()
        started = now
        if pod.status and pod.status.start_time:
            started = rfc3339(pod.status.start_time)
        statuses = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "message": message,
                        "startedAt": started,
                        "finishedAt": now,
                    }
                },
            }
            for c in pod.spec.containers
        ]
        conditions = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastProbeTime": None, "lastTransitionTime": now}
            for t in ("ContainersReady", "Ready")
        ]
        body = {
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": conditions,
                "containerStatuses": statuses,
            }
        }
        return self.core.patch_namespaced_pod_status(name, namespace, body)
