"""A whole Kubernetes cluster on this machine: :class:`LocalCluster`.

``start()`` (in this order; every step's effects are recorded in ``<state_dir>/localcluster.json`` before it runs,
so ``stop()`` — or ``down`` from a saved state after a crash — undoes exactly what was made):

1. takes the machine lock ``/run/lock/zjusct-real-node.lock`` (the same one a single
   :class:`~.node.RealNode` takes: both use kubelet's fixed host paths) and records the host sysctls kubelet writes;
2. the host side (:func:`.hostnet.setup_host`): bridge ``zjnbr0`` 10.240.0.1/24, the empty mount points, the
   private mount that pins the nodes' mount namespaces;
3. the control plane (:class:`~.controlplane.Cluster`, no Node objects of its own): kube-apiserver binds
   10.240.0.1:6443 (nodes and Pods reach it; the certificate's SANs hold it and 10.96.0.1), the ``kubernetes``
   Service's endpoint is that address; etcd, controller-manager and scheduler stay on 127.0.0.1;
4. RBAC for kube-router (ClusterRole ``zjusct:kube-router``: read Pods, Namespaces, NetworkPolicies, Nodes,
   Services, Endpoints, EndpointSlices; bound to user ``system:kube-router``);
5. N :class:`~.nsnode.NamespacedNode` (``node-1`` .. ``node-N``), one after the other, each Ready with kube-proxy
   and kube-router synced;
6. Ceph (optional, bootstrapped in a thread beside steps 3-5 right after step 2: it needs only the bridge address):
   mon, mgr and ``ceph_osds`` OSDs bound to 10.240.0.1, pool ``rbd``; ``<ceph>/client/`` holds a client
   configuration a Pod mounts at ``/etc/ceph``.

``stop()`` undoes it in reverse and releases the lock. The daemons carry ``PR_SET_PDEATHSIG`` (they die with the
process that owns the LocalCluster: the test session, or the ``hack/cluster.sh up`` supervisor); namespaces,
mounts, cgroups, routes and the bridge do not die with a process, which is why the state file exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import ceph as cephmod
from . import hostnet
from .binaries import Binaries
from .controlplane import Cluster, ClusterError, stop_state_dir
from .node import LOCK_PATH, RealNode, RealNodeError, node_images, take_machine_lock, teardown
from .node import STATE_FILE as NODE_STATE_FILE
from .nsnode import KUBE_ROUTER_ROLE, KUBE_ROUTER_USER, LOSS_MODES, NamespacedNode

STATE_FILE = "localcluster.json"
DEFAULT_STATE_DIR = Path("/var/lib/zjusct-localcluster")
APISERVER_PORT = 6443
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


class LocalClusterError(RuntimeError):
    """The local cluster could not be started or a command on it failed; the message says which step and why."""


def missing_reason(ceph: bool = True) -> str | None:
    """What this machine lacks for a local cluster (binaries, Debian packages, root), or None.

    Args:
        ceph: whether the Ceph daemons are needed too.
    """
    binaries = Binaries.pinned()
    reasons = [r for r in (binaries.missing_reason(), RealNode.missing_reason(),
                           binaries.node_agents_missing_reason()) if r]
    tools = ["ip", "nsenter", "unshare", "mount", "iptables", "iptables-save", "ipset", "sysctl"]
    if ceph:
        tools += ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd"]
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        reasons.append(f"{', '.join(absent)} not installed (hack/install-deps.sh; Debian: iproute2, util-linux, "
                       "iptables, ipset, procps, ceph)")
    return "; ".join(reasons) or None


class LocalCluster:
    """The control plane, ``nodes`` real nodes and optionally Ceph, on this machine (module docstring).

    Args:
        state_dir: where everything is kept (default: a new temp dir; ``hack/cluster.sh`` uses
            :data:`DEFAULT_STATE_DIR`); removed by :meth:`stop` unless ``keep_state``.
        nodes: how many nodes (1..3).
        node_names: their names (default ``node-1`` ..).
        ceph: start Ceph too.
        ceph_osds: how many OSDs.
        extra_images: docker-archives imported into every node's containerd besides pause and busybox.
        kubelet_overrides: KubeletConfiguration fields for every node (e.g. ``{"maxPods": 30}``).
        node_grace_seconds: kube-controller-manager ``--node-monitor-grace-period`` (a lost node is NotReady and
            tainted ``unreachable`` after it).
        lock_timeout: seconds to wait for the machine lock.
        die_with_parent: daemons die with this process (PR_SET_PDEATHSIG).
        keep_state: keep ``state_dir`` (logs) after :meth:`stop`.

    Raises:
        ValueError: ``nodes`` or ``node_names`` are invalid (the message names the value and the rule).
    """

    def __init__(self, state_dir: Path | None = None, nodes: int = 2, node_names: list[str] | None = None,
                 ceph: bool = True, ceph_osds: int = 3, extra_images: tuple[Path, ...] = (),
                 kubelet_overrides: dict[str, Any] | None = None, node_grace_seconds: int = 16,
                 lock_timeout: float = 900.0, die_with_parent: bool = True, keep_state: bool = False) -> None:
        self.addressing = hostnet.node_addressing(nodes, node_names)
        if ceph and not 1 <= ceph_osds <= 8:
            raise ValueError(f"--ceph-osds {ceph_osds}: must be 1..8")
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="zjusct-localcluster-")).resolve()
        longest = self.state_dir / "nodes" / max(self.node_names, key=len) / "containerd" / "containerd.sock.ttrpc"
        if len(str(longest).encode()) > UNIX_PATH_MAX:
            raise ValueError(f"--state-dir {self.state_dir}: too long ({len(str(self.state_dir))} bytes): containerd's "
                             f"socket {longest} would exceed a Unix socket path's {UNIX_PATH_MAX} bytes")
        self.want_ceph = ceph
        self.ceph_osds = ceph_osds
        self.extra_images = tuple(extra_images)
        self.kubelet_overrides = dict(kubelet_overrides or {})
        self.node_grace_seconds = node_grace_seconds
        self.lock_timeout = lock_timeout
        self.die_with_parent = die_with_parent
        self.keep_state = keep_state
        self.control_plane: Cluster | None = None
        self.nodes: dict[str, NamespacedNode] = {}
        self.ceph: cephmod.Cluster | None = None
        self.timings: dict[str, float] = {}
        self._host: dict[str, Any] = {}
        self._lock_fd: int | None = None
        self._clients: dict[str, Any] = {}
        self._ceph_thread: threading.Thread | None = None
        self._ceph_error: Exception | None = None
        self._ceph_seconds = 0.0
        self._stopped = False

    # ------------------------------------------------------------------ what a user of the cluster needs

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``kubernetes-admin``, group ``system:masters``)."""
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    @property
    def node_names(self) -> list[str]:
        """The nodes' names in index order."""
        return [a.name for a in self.addressing]

    def node(self, name: str) -> NamespacedNode:
        """The running node ``name``.

        Raises:
            LocalClusterError: no such node (the message lists the nodes).
        """
        if name not in self.nodes:
            raise LocalClusterError(f"node {name!r}: no such node; nodes: {', '.join(self.node_names)}")
        return self.nodes[name]

    def api_client(self, user: str = "admin") -> Any:
        """A new ``kubernetes.client.ApiClient`` for ``user`` (``admin`` or ``alice``, the tenant)."""
        assert self.control_plane is not None
        return self.control_plane.api_client(user)

    def pod_placement(self, node: str) -> dict[str, Any]:
        """Pod spec fields that put a Pod on ``node`` (``nodeSelector`` on its hostname label)."""
        return {"nodeSelector": {"kubernetes.io/hostname": self.node(node).name}}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 600.0) -> LocalCluster:
        """Bring everything up (module docstring); ``timings`` gets seconds per step and ``total_s``.

        Raises:
            LocalClusterError: something is missing, a step failed or ``timeout`` elapsed; everything made so far
                has been undone when this is raised.
            TimeoutError: the machine lock stayed held for ``lock_timeout`` s.
        """
        reason = missing_reason(self.want_ceph)
        if reason:
            raise LocalClusterError(reason)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # keys, kubeconfigs and the Ceph admin keyring live here
        self._lock_fd = take_machine_lock(f"local cluster {self.state_dir}", self.lock_timeout)
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        t0 = time.monotonic()
        self._host = {"sysctls_before": hostnet.read_sysctls(hostnet.KUBELET_SYSCTLS), "created_paths": [],
                      "nodes": {}, "host_setup": True}
        self._save_state()
        try:
            self._host["created_paths"] = hostnet.setup_host()
        except hostnet.HostNetError as exc:
            raise LocalClusterError(f"host network: {exc}") from exc
        self._save_state()
        self.timings["host_s"] = time.monotonic() - t0
        if self.want_ceph:  # Ceph needs only the bridge address: it bootstraps beside the control plane and nodes
            self._host["ceph_base"] = str(self.state_dir)
            self._save_state()
            self._ceph_thread = threading.Thread(target=self._start_ceph, args=(deadline,), name="ceph", daemon=True)
            self._ceph_thread.start()

        t = time.monotonic()
        self.control_plane = Cluster(state_dir=self.state_dir / "control-plane", nodes=(), keep_state=True,
                                     bind_address=hostnet.HOST_IP, apiserver_port=APISERVER_PORT,
                                     node_grace_seconds=self.node_grace_seconds)
        self._save_state()
        try:
            self.control_plane.start(timeout=max(30.0, deadline - time.monotonic()))
        except ClusterError as exc:
            raise LocalClusterError(f"control plane: {exc}") from exc
        self._bootstrap_rbac()
        self.timings["control_plane_s"] = time.monotonic() - t

        t = time.monotonic()
        try:
            node_images()  # build the pause/busybox archives once, not per node
        except RealNodeError as exc:
            raise LocalClusterError(str(exc)) from exc
        for addressing in self.addressing:
            t_node = time.monotonic()
            node = NamespacedNode(self.control_plane.state_dir, addressing, self.addressing,
                                  work_dir=self.state_dir / "nodes" / addressing.name,
                                  extra_images=self.extra_images, die_with_parent=self.die_with_parent,
                                  kubelet_overrides=self.kubelet_overrides)
            self.nodes[addressing.name] = node
            self._host["nodes"][addressing.name] = str(node.work)
            self._save_state()
            try:
                node.start(timeout=max(30.0, deadline - time.monotonic()))
            except (RealNodeError, TimeoutError) as exc:
                raise LocalClusterError(f"node {addressing.name}: {exc}") from exc
            self.timings[f"node_{addressing.name}_s"] = time.monotonic() - t_node
        self.timings["nodes_s"] = time.monotonic() - t

        if self._ceph_thread is not None:
            self._ceph_thread.join(timeout=max(1.0, deadline - time.monotonic()))
            if self._ceph_thread.is_alive():
                raise LocalClusterError("ceph: still bootstrapping when the start's timeout ran out")
            if self._ceph_error is not None:
                raise LocalClusterError(f"ceph: {self._ceph_error}") from self._ceph_error
            self.timings["ceph_s"] = self._ceph_seconds
        self.timings["total_s"] = time.monotonic() - t0
        self._host["ready"] = True
        self._save_state()

    def _start_ceph(self, deadline: float) -> None:
        """Bootstrap Ceph (run in a thread by :meth:`_start`; its daemons detach themselves, no PR_SET_PDEATHSIG
        is involved). The result lands in ``self.ceph`` or ``self._ceph_error``."""
        t = time.monotonic()
        try:
            ceph = cephmod.start_cluster(self.state_dir, timeout=max(60.0, deadline - time.monotonic()),
                                         address=hostnet.HOST_IP, osds=self.ceph_osds)
            ceph.client_dir()
            self.ceph = ceph
        except Exception as exc:  # reported by _start; start_cluster has stopped what it started
            self._ceph_error = exc
        self._ceph_seconds = time.monotonic() - t  # timings is the main thread's (saved while this runs)

    def stop(self) -> None:
        """Undo everything :meth:`start` made, in reverse, and release the lock. Safe to call twice and after a
        failed start."""
        if self._stopped:
            return
        self._stopped = True
        if self._ceph_thread is not None:  # a failed start: let the bootstrap end (it cleans up after a failure)
            self._ceph_thread.join(timeout=600)
        for api in self._clients.values():
            with contextlib.suppress(Exception):
                api.close()
        if self.keep_state:  # the nodes' work dirs go with them: keep their logs
            for name, node in self.nodes.items():
                with contextlib.suppress(OSError):
                    shutil.copytree(node.work / "logs", self.state_dir / "logs" / name, dirs_exist_ok=True)
        try:
            if self._host:
                down_from_state(self.state_dir, self._state(), live_nodes=self.nodes, ceph=self.ceph,
                                control_plane=self.control_plane)
        finally:
            if not self.keep_state:
                shutil.rmtree(self.state_dir, ignore_errors=True)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # ------------------------------------------------------------------ nodes lost and restored

    def lose_node(self, name: str, how: str = "poweroff") -> None:
        """Take node ``name`` away (``how`` in :data:`~.nsnode.LOSS_MODES`); see :meth:`NamespacedNode.lose`.

        Raises:
            LocalClusterError: unknown node or ``how``.
        """
        try:
            self.node(name).lose(how)
        except ValueError as exc:
            raise LocalClusterError(str(exc)) from exc

    def restore_node(self, name: str, timeout: float = 300.0) -> None:
        """Bring node ``name`` back and wait until it is Ready (see :meth:`NamespacedNode.restore`).

        Raises:
            LocalClusterError: unknown node, or it did not come back within ``timeout`` s.
        """
        try:
            self.node(name).restore(timeout)
        except RealNodeError as exc:
            raise LocalClusterError(f"node {name}: {exc}") from exc

    def wait_node(self, name: str, ready: bool = True, timeout: float = 120.0) -> Any:
        """Wait until Node ``name`` is Ready without lifecycle taints (``ready``), or not Ready and tainted
        ``node.kubernetes.io/unreachable``; return the V1Node.

        Raises:
            TimeoutError: not reached within ``timeout`` s (the message names the conditions and taints seen last).
        """
        from kubernetes import client

        if "admin" not in self._clients:
            self._clients["admin"] = self.api_client()
        core: Any = client.CoreV1Api(self._clients["admin"])
        deadline = time.monotonic() + timeout
        seen: Any = None
        while True:
            with contextlib.suppress(Exception):
                n = core.read_node(name)
                cond = {c.type: c.status for c in (n.status.conditions or [])}
                taints = {t.key for t in (n.spec.taints or [])}
                seen = (cond.get("Ready"), sorted(taints))
                if ready and cond.get("Ready") == "True" and not taints & LIFECYCLE_TAINTS:
                    return n
                if not ready and cond.get("Ready") != "True" and "node.kubernetes.io/unreachable" in taints:
                    return n
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} not {'Ready' if ready else 'lost'} after {timeout}s; "
                                   f"last seen (Ready, taints): {seen}")
            time.sleep(0.5)

    # ------------------------------------------------------------------ state

    def status(self) -> dict[str, Any]:
        """What runs: per node its agents (alive or not) and link, the Ceph daemons, the control plane's pids."""
        return status_from_state(self.state_dir)

    def _state(self) -> dict[str, Any]:
        cp = self.control_plane
        return {
            **self._host,
            "version": 1,
            "state_dir": str(self.state_dir),
            "supervisor": os.getpid(),
            "addressing": [{"name": a.name, "index": a.index} for a in self.addressing],
            "control_plane": str(cp.state_dir) if cp else None,
            "server": cp.server if cp else None,
            "kubeconfig": str(cp.kubeconfigs["admin"]) if cp and "admin" in cp.kubeconfigs else None,
            "tenant_kubeconfig": str(cp.kubeconfigs["alice"]) if cp and "alice" in cp.kubeconfigs else None,
            "ceph_dir": str(self.ceph.state_dir) if self.ceph else None,
            "ceph_conf": str(self.ceph.conf) if self.ceph else None,
            "ceph_client_dir": str(self.ceph.state_dir / "client") if self.ceph else None,
            "timings": self.timings,
        }

    def _save_state(self) -> None:
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self._state(), indent=2) + "\n")
        tmp.replace(self.state_dir / STATE_FILE)

    def _bootstrap_rbac(self) -> None:
        from kubernetes import client

        assert self.control_plane is not None
        api = self.control_plane.api_client()
        try:
            rbac: Any = client.RbacAuthorizationV1Api(api)
            read = ["get", "list", "watch"]
            rbac.create_cluster_role({
                "metadata": {"name": KUBE_ROUTER_ROLE},
                "rules": [
                    {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                     "verbs": read},
                    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                ],
            })
            rbac.create_cluster_role_binding({
                "metadata": {"name": KUBE_ROUTER_ROLE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUBE_ROUTER_ROLE},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBE_ROUTER_USER}],
            })
        finally:
            api.close()


# --------------------------------------------------------------------------- from a saved state


def load_state(state_dir: Path) -> dict[str, Any]:
    """Read ``<state_dir>/localcluster.json``.

    Raises:
        FileNotFoundError: no local cluster state there.
    """
    return dict(json.loads((state_dir / STATE_FILE).read_text()))


def down_from_state(state_dir: Path, state: dict[str, Any], live_nodes: dict[str, NamespacedNode] | None = None,
                    ceph: cephmod.Cluster | None = None, control_plane: Cluster | None = None) -> None:
    """Undo a local cluster from its saved state, in reverse order of :meth:`LocalCluster.start`: nodes (agents,
    containers, namespaces, routes, cgroups), Ceph, the control plane, the host side, the host sysctls.

    The objects of a live :class:`LocalCluster` are used where given (their processes are this process's
    children); otherwise everything is found from the state files (after the owner crashed: its daemons died with
    it, but namespaces, mounts, cgroups and the bridge stay).
    """
    live_nodes = live_nodes or {}
    for name, work in reversed(list(state.get("nodes", {}).items())):
        if name in live_nodes:
            live_nodes[name].stop()
            continue
        work_dir = Path(work)
        node_state_file = work_dir / NODE_STATE_FILE
        if node_state_file.exists():
            teardown(work_dir, json.loads(node_state_file.read_text()))
        else:  # saved before the node wrote its own state: undo the namespaces it may have begun
            index = next(a["index"] for a in state["addressing"] if a["name"] == name)
            hostnet.teardown_node(hostnet.NodeAddressing(name, index))
            shutil.rmtree(work_dir, ignore_errors=True)
    if ceph is not None:
        ceph.stop()
    elif state.get("ceph_dir"):
        cephmod.stop_cluster(state["ceph_dir"])
    elif state.get("ceph_base"):  # started, directory name not saved yet
        for d in Path(state["ceph_base"]).glob("zceph-*"):
            cephmod.stop_cluster(d)
    if control_plane is not None:
        control_plane.stop()
    elif state.get("control_plane") and Path(state["control_plane"], "state.json").exists():
        stop_state_dir(Path(state["control_plane"]))
    if state.get("host_setup"):
        hostnet.teardown_host(state.get("created_paths", []))
    hostnet.restore_sysctls(state.get("sysctls_before", {}))


def status_from_state(state_dir: Path) -> dict[str, Any]:
    """What runs, read from the state files and /proc (no API call): ``{"ready", "supervisor", "server",
    "kubeconfig", "tenant_kubeconfig", "ceph_conf", "ceph_keyring", "ceph_mon_host", "control_plane": {component:
    alive}, "nodes": {name: {"ip", "pod_cidr", "containerd_address", agent: alive, "link": up}}, "ceph": {daemon:
    alive}}``. ``containerd_address`` is the node's containerd socket (``ctr --address``; where an operator imports
    images into that node); the Ceph fields are None without Ceph (``ceph_mon_host`` as ``mon_host`` takes it).

    Raises:
        FileNotFoundError: no local cluster state in ``state_dir``.
    """
    from .controlplane import load_state as load_cp_state
    from .controlplane import pid_alive, pid_is_ours

    state = load_state(state_dir)
    out: dict[str, Any] = {"ready": bool(state.get("ready")), "server": state.get("server"),
                           "kubeconfig": state.get("kubeconfig"), "tenant_kubeconfig": state.get("tenant_kubeconfig"),
                           "ceph_conf": state.get("ceph_conf"), "ceph_keyring": None, "ceph_mon_host": None,
                           "supervisor": pid_alive(int(state.get("supervisor", 0) or 0)), "control_plane": {},
                           "nodes": {}, "ceph": {}}
    if state.get("ceph_conf"):
        out["ceph_keyring"] = str(Path(state["ceph_conf"]).parent / "ceph.client.admin.keyring")
        with contextlib.suppress(OSError):
            out["ceph_mon_host"] = next((line.split("=", 1)[1].strip() for line in
                                         Path(state["ceph_conf"]).read_text().splitlines()
                                         if line.strip().startswith("mon_host")), None)
    if state.get("control_plane"):
        with contextlib.suppress(OSError, ValueError):
            cp = load_cp_state(Path(state["control_plane"]))
            out["control_plane"] = {n: pid_is_ours(int(p), cp["state_dir"]) for n, p in cp["pids"].items()
                                    if n != "supervisor"}
    for a in state.get("addressing", []):
        addressing = hostnet.NodeAddressing(a["name"], a["index"])
        work = state.get("nodes", {}).get(a["name"])
        sock = str(Path(work, "containerd", "containerd.sock")) if work else None
        info: dict[str, Any] = {"ip": addressing.ip, "pod_cidr": addressing.pod_cidr, "containerd_address": sock}
        pids: dict[str, int] = {}
        if work:
            with contextlib.suppress(OSError, ValueError):
                pids = json.loads(Path(work, NODE_STATE_FILE).read_text()).get("pids", {})
        for agent in ("containerd", "kubelet", "kube-proxy", "kube-router"):
            info[agent] = bool(work) and agent in pids and pid_is_ours(int(pids[agent]), str(work))
        info["link"] = hostnet.link_up(addressing)
        out["nodes"][a["name"]] = info
    if state.get("ceph_dir"):
        run = Path(state["ceph_dir"], "run")
        for pidfile in sorted(run.glob("*.pid")):
            with contextlib.suppress(OSError, ValueError):
                out["ceph"][pidfile.name[:-4]] = pid_is_ours(int(pidfile.read_text().strip()),
                                                             str(Path(state["ceph_dir"], "ceph.conf")))
    return out


def lock_holder() -> str:
    """What the machine lock file says about its holder ('' if none wrote it)."""
    with contextlib.suppress(OSError):
        return LOCK_PATH.read_text().strip()
    return ""


def loss_modes() -> dict[str, str]:
    """``{how: what it does}`` for :meth:`LocalCluster.lose_node`."""
    return dict(LOSS_MODES)


def ceph_in_pod(ceph_client_dir: str) -> dict[str, Any]:
    """Pod spec pieces that let a busybox container run the host's Ceph clients (``rbd``, ``ceph``): the host's
    ``/usr`` (and ``/lib``, ``/lib64`` from it: the busybox image has no loader) read-only, and the client
    configuration directory at ``/etc/ceph``. Returns ``{"volumes": [...], "volumeMounts": [...]}``."""
    mounts = {"usr": ("/usr", "/usr"), "lib": ("/usr/lib", "/lib"), "lib64": ("/usr/lib64", "/lib64"),
              "ceph": (ceph_client_dir, "/etc/ceph")}
    return {
        "volumes": [{"name": k, "hostPath": {"path": src, "type": "Directory"}} for k, (src, _) in mounts.items()],
        "volumeMounts": [{"name": k, "mountPath": dst, "readOnly": True} for k, (_, dst) in mounts.items()],
    }
