"""Start and stop a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) on 127.0.0.1 with ephemeral ports, generated PKI and a state directory; kube-apiserver binds
another address of this host instead when one is given (``bind_address``: the host side of the nodes' bridge in a
:class:`~zjusct_localcluster.cluster.LocalCluster`, so nodes and Pods in other network namespaces reach it).

The daemons are always children of the Python process that owns the :class:`Cluster` and die with
it (``PR_SET_PDEATHSIG``); the node heartbeat is a thread of that process. For pytest that process
is the test session. ``python -m tests.cluster up`` starts a detached supervisor process
(``_serve``) that owns the cluster; its pid and the daemons' pids are in ``<state_dir>/state.json``
and ``down`` stops them by pid.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .binaries import REPO, Binaries
from .pki import PKI, KeyPair, write_kubeconfig
from .virtualnodes import DEFAULT_NODES, Heartbeat, Kubelet, NodeSpec, node_manifest, pause_marker

STATE_FILE = "state.json"
TENANT_USER = "alice"
TENANT_NAMESPACE = "tenant-alice"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
# The collection's kube-apiserver audit policy (docs/security.md, "Audit"); every control plane started here logs
# with it into <state_dir>/logs/audit.log, rotated at AUDIT_LOG_LIMITS so a long-lived cluster's log stays bounded.
AUDIT_POLICY = REPO / "config" / "audit" / "policy.yaml"
AUDIT_LOG_LIMITS = {"maxage": 7, "maxbackup": 3, "maxsize": 100}  # days, rotated files kept, MiB per file
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
# Seconds a test waits for a control-plane controller (scheduler, node lifecycle, garbage collector) to act on a
# change. Alone each acts within 1-3 s; beside the suite's other lanes (TCG guests keeping both cores busy) the
# scheduler's event for an unschedulable Pod has taken over 30 s (CI of 2026-12-02). A wait returns as soon as
# its condition holds, so this bound costs nothing when the cluster is quick.
CONTROL_PLANE_WAIT = 120.0
# Stopped stage by stage: kube-apiserver needs etcd while it shuts down (else it hangs ~10 s).
STOP_STAGES = (("supervisor",), ("kube-scheduler", "kube-controller-manager"), ("kube-apiserver",), ("etcd",))


class ClusterError(RuntimeError):
    """The control plane could not be started, or a component died or timed out."""


# --------------------------------------------------------------------------- processes


_libc: Any = None


def _die_with_parent() -> None:  # runs in the forked child before exec
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _load_libc() -> None:
    global _libc
    if _libc is None:
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pid_is_ours(pid: int, marker: str) -> bool:
    """True if process ``pid`` is alive and its command line contains ``marker`` (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return pid_alive(pid) and marker in cmdline


def kill_pids(pids: dict[str, int], marker: str, timeout: float = 10.0) -> list[str]:
    """SIGTERM every pid whose command line contains ``marker``, SIGKILL those alive after ``timeout`` s.

    Children of this process must be reaped by the caller (``Popen.wait``); other pids are only polled.

    Returns:
        Names of processes that had to be SIGKILLed.
    """
    ours = {name: pid for name, pid in pids.items() if pid_is_ours(pid, marker)}
    for pid in ours.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in ours.values()):
        for pid in ours.values():  # reap our own children so they do not linger as zombies
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    killed = []
    for name, pid in ours.items():
        if pid_alive(pid):
            killed.append(name)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid in ours.values():
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    return killed


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Process:
    """One daemon: its argv, log file and process handle."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None


# --------------------------------------------------------------------------- cluster


class Cluster:
    """A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with Cluster() as c:
            v1 = kubernetes.client.CoreV1Api(c.api_client())

    Args:
        state_dir: directory for PKI, kubeconfigs, etcd data and logs; a new temp dir when ``None``.
            It is removed by :meth:`stop` (unless ``keep_state``).
        binaries: binary paths (default: the pinned versions in the cache, see ``hack/build-k8s.sh``).
        nodes: Node objects to register.
        node_grace_seconds: kube-controller-manager ``--node-monitor-grace-period``: how long a node may
            miss heartbeats before it is marked NotReady/Unknown and tainted.
        heartbeat_interval: seconds between node heartbeats (Lease renewal + Ready condition).
        keep_state: keep the state directory on :meth:`stop` (logs for debugging).
        bind_address: the IPv4 address kube-apiserver binds and advertises (default 127.0.0.1, reachable only
            from this network namespace). Any other address must exist on this host before :meth:`start`; it
            is then also the ``kubernetes`` Service's endpoint (the lease endpoint reconciler publishes it, which
            kube-proxy turns into the 10.96.0.1 rules) and a SAN of the serving certificate.
        apiserver_port: kube-apiserver's ``--secure-port`` (default: a free ephemeral port).
        audit_policy: the audit policy kube-apiserver logs with (default the collection's
            config/audit/policy.yaml); copied into the state dir at start, the log is :attr:`audit_log`.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        binaries: Binaries | None = None,
        nodes: Iterable[NodeSpec] = DEFAULT_NODES,
        *,
        node_grace_seconds: int = 16,
        heartbeat_interval: float = 2.0,
        keep_state: bool = False,
        bind_address: str = "127.0.0.1",
        apiserver_port: int | None = None,
        audit_policy: Path = AUDIT_POLICY,
    ) -> None:
        self.audit_policy = Path(audit_policy)
        self.bind_address = bind_address
        self.apiserver_port = apiserver_port
        self.binaries = binaries or Binaries.pinned()
        self.nodes = tuple(nodes)
        self.node_grace_seconds = node_grace_seconds
        self.heartbeat_interval = heartbeat_interval
        self.keep_state = keep_state
        self._own_state_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="zjusct-k8s-")).resolve()
        self.processes: dict[str, Process] = {}
        self.ports: dict[str, int] = {}
        self.kubeconfigs: dict[str, Path] = {}
        self.timings: dict[str, float] = {}
        self.server = ""
        self._pki: PKI | None = None
        self._heartbeat: Heartbeat | None = None
        self._clients: dict[str, Any] = {}
        self._stopped = False

    # ------------------------------------------------------------------ public API

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user ``kubernetes-admin`` in group ``system:masters``)."""
        return self.kubeconfigs["admin"]

    @property
    def tenant_kubeconfig(self) -> Path:
        """The limited user's kubeconfig (user ``alice``, ``edit`` rights only in ``tenant-alice``)."""
        return self.kubeconfigs[TENANT_USER]

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (one JSON ``audit.k8s.io/v1`` Event a line, :attr:`audit_policy`'s rules);
        rotated files beside it are ``audit-<timestamp>.log``."""
        return self.state_dir / "logs" / "audit.log"

    def api_client(self, user: str = "admin") -> Any:
        """A new ``kubernetes.client.ApiClient`` for ``user`` (``admin``, ``alice``, or a node name).

        Raises:
            KeyError: no kubeconfig for ``user``.
        """
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfigs[user]))

    def kubelet(self, node: str) -> Kubelet:
        """A :class:`Kubelet` stand-in for ``node`` (writes Pod status with the node's identity).

        Raises:
            KeyError: ``node`` is not a registered node.
        """
        spec = {n.name: n for n in self.nodes}[node]
        return Kubelet(self.api_client(node), node, spec.address)

    def stop_heartbeat(self, node: str) -> None:
        """Stop renewing ``node``'s Lease and Ready condition (simulates a lost node/kubelet).

        After ``node_grace_seconds`` the node lifecycle controller marks the node Ready=Unknown and
        taints it ``node.kubernetes.io/unreachable`` (NoSchedule, NoExecute).
        """
        marker = pause_marker(self.state_dir, node)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    def resume_heartbeat(self, node: str) -> None:
        """Resume heartbeats for ``node`` (the controller then clears the taints)."""
        pause_marker(self.state_dir, node).unlink(missing_ok=True)

    def wait_node_ready(self, node: str, ready: bool = True, timeout: float = 90.0) -> Any:
        """Wait until ``node``'s Ready condition is True (``ready``) or not True, and, when ready, it
        carries no not-ready/unreachable taint; when not ready, until it carries the unreachable taint.

        Returns:
            The V1Node.

        Raises:
            TimeoutError: the state was not reached within ``timeout`` seconds.
        """
        from kubernetes import client

        core: Any = client.CoreV1Api(self._admin())
        deadline = time.monotonic() + timeout
        while True:
            n = core.read_node(node)
            cond = {c.type: c.status for c in (n.status.conditions or [])}
            taints = {t.key for t in (n.spec.taints or [])}
            if ready and cond.get("Ready") == "True" and not taints & LIFECYCLE_TAINTS:
                return n
            if not ready and cond.get("Ready") != "True" and "node.kubernetes.io/unreachable" in taints:
                return n
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node} not {'ready' if ready else 'lost'} after {timeout}s: {cond} {taints}")
            time.sleep(0.5)

    def pids(self) -> dict[str, int]:
        """``{component: pid}`` of the running daemons."""
        return {name: p.pid for name, p in self.processes.items()}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> Cluster:
        """Start everything and wait until the cluster is usable.

        Usable means: kube-apiserver ``/readyz`` ok, controller-manager and scheduler ``/healthz`` ok,
        every node Ready without not-ready taint, the tenant's RBAC aggregated and the tenant
        namespace's ``default`` ServiceAccount created. ``timings`` gets ``readyz_s`` and ``usable_s``
        (seconds since the first process was spawned).

        Args:
            timeout: seconds to wait for the cluster to become usable.

        Returns:
            ``self``.

        Raises:
            ClusterError: a binary is missing, a component exited, or ``timeout`` elapsed; everything
                started so far has been stopped when this is raised.
        """
        reason = self.binaries.missing_reason()
        if reason:
            raise ClusterError(reason)
        sweep_stale_state_dirs()
        _load_libc()
        atexit.register(self.stop)
        for attempt in (1, 2):
            try:
                self._start_once(timeout)
                return self
            except ClusterError as exc:
                logs = "\n".join(tail(p.log, 200) for p in self.processes.values())
                self._kill_all()
                if attempt == 1 and "address already in use" in logs:
                    continue  # an ephemeral port was taken between choosing and binding it: retry
                self.stop()
                raise exc
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop the heartbeat and every daemon (SIGTERM, SIGKILL after 10 s) and remove the state dir.

        Safe to call more than once and after a failed :meth:`start`.
        """
        if self._stopped:
            return
        self._stopped = True
        self._kill_all()
        for api in self._clients.values():
            with contextlib.suppress(Exception):
                api.close()
        self._clients.clear()
        if not self.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # ------------------------------------------------------------------ internals

    def _admin(self) -> Any:
        if "admin" not in self._clients:
            self._clients["admin"] = self.api_client("admin")
        return self._clients["admin"]

    def _kill_all(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        for stage in STOP_STAGES:
            kill_pids({n: self.processes[n].pid for n in stage if n in self.processes}, str(self.state_dir))
        for p in self.processes.values():
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=5)

    def _start_once(self, timeout: float) -> None:
        t0 = time.monotonic()
        self.processes.clear()
        for sub in ("pki", "logs", "etcd", "kubeconfig", "heartbeat"):
            path = self.state_dir / sub
            if sub == "etcd":
                shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "etcd").chmod(0o700)
        # a copy: the running kube-apiserver (and restart_apiserver) never sees an edit of the checkout's file
        shutil.copyfile(self.audit_policy, self.state_dir / "audit-policy.yaml")
        names = ("etcd-client", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        if self.apiserver_port:
            self.ports["kube-apiserver"] = self.apiserver_port
        self.server = f"https://{self.bind_address}:{self.ports['kube-apiserver']}"
        self._write_pki()
        for name in ("etcd", "kube-apiserver"):
            self._spawn(name, self._argv(name))
        self._save_state()

        deadline = t0 + timeout
        self._wait_https(f"{self.server}/readyz", "kube-apiserver", deadline, client_cert=True)
        self.timings["readyz_s"] = time.monotonic() - t0
        # only now: both exit at once if their RBAC (bootstrapped by kube-apiserver) is not there yet
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._spawn(name, self._argv(name))
        self._bootstrap_objects()
        self._start_heartbeat()
        self._save_state()
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._wait_https(f"https://127.0.0.1:{self.ports[name]}/healthz", name, deadline)
        for spec in self.nodes:
            self._wait(functools.partial(self._node_schedulable, spec.name), f"node {spec.name} Ready", deadline)
        self._wait(self._tenant_ready, "tenant RBAC aggregated and default ServiceAccount created", deadline)
        self.timings["usable_s"] = time.monotonic() - t0
        self._save_state()

    def _write_pki(self) -> None:
        pki = PKI(self.state_dir / "pki")
        self._pki = pki
        serving_ips = tuple(dict.fromkeys(("127.0.0.1", "10.96.0.1", self.bind_address)))
        serving_dns = (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
        pki.issue("kube-apiserver", "kube-apiserver", server=True, dns=serving_dns, ips=serving_ips)
        pki.issue(
            "kube-controller-manager-serving",
            "kube-controller-manager",
            server=True,
            dns=("localhost",),
            ips=("127.0.0.1",),
        )
        pki.issue("kube-scheduler-serving", "kube-scheduler", server=True, dns=("localhost",), ips=("127.0.0.1",))
        # kube-apiserver -> kubelet (logs, exec, port-forward of a real node); authorized by the kubelet's
        # webhook through the ClusterRoleBinding made in _bootstrap_objects
        pki.issue("kube-apiserver-kubelet-client", KUBELET_CLIENT_USER, client=True)
        users: dict[str, tuple[str, tuple[str, ...]]] = {
            "admin": ("kubernetes-admin", ("system:masters",)),
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            "kube-scheduler": ("system:kube-scheduler", ()),
            TENANT_USER: (TENANT_USER, ()),
        }
        for node in self.nodes:
            users[node.name] = (f"system:node:{node.name}", ("system:nodes",))
        for key, (cn, orgs) in users.items():
            pair = pki.issue(f"client-{key}", cn, orgs, client=True)
            self.kubeconfigs[key] = write_kubeconfig(
                self.state_dir / "kubeconfig" / f"{key}.kubeconfig", self.server, pki.ca, pair, cn
            )

    def _argv(self, name: str) -> list[str]:
        pki = self._pki
        assert pki is not None
        d = pki.dir
        p = self.ports
        if name == "etcd":
            client_url = f"http://127.0.0.1:{p['etcd-client']}"
            peer_url = f"http://127.0.0.1:{p['etcd-peer']}"
            return [
                str(self.binaries.etcd),
                "--name=test",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # throw-away data: no fsync keeps it fast on a busy disk
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            return [
                str(self.binaries.kube_apiserver),
                f"--advertise-address={self.bind_address}",
                f"--bind-address={self.bind_address}",
                f"--secure-port={p['kube-apiserver']}",
                f"--etcd-servers=http://127.0.0.1:{p['etcd-client']}",
                f"--tls-cert-file={d / 'kube-apiserver.crt'}",
                f"--tls-private-key-file={d / 'kube-apiserver.key'}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                # default plugins plus NodeRestriction (as kubeadm sets it): a node may only write its
                # own Node, Lease and the status of Pods bound to it
                "--enable-admission-plugins=NodeRestriction",
                # 127.0.0.1 is not a valid Endpoints address: the kubernetes Service then has no endpoint; any
                # other bind address becomes its endpoint (what kube-proxy of a real node DNATs 10.96.0.1:443 to)
                "--endpoint-reconciler-type=" + ("none" if self.bind_address.startswith("127.") else "lease"),
                "--allow-privileged=true",
                "--profiling=false",
                # real nodes (node.RealNode, the local cluster's): reach a kubelet by the node IP (the node name is
                # no DNS name), authenticate with a client certificate and verify the kubelet's serving certificate
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={d / 'kube-apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'kube-apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki.ca.cert}",
                # audit: who changed which CloudVM, claim, PV, launcher Pod, Event (config/audit/policy.yaml)
                f"--audit-policy-file={self.state_dir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                *(f"--audit-log-{key}={value}" for key, value in AUDIT_LOG_LIMITS.items()),
            ]
        common = [
            f"--kubeconfig={self.kubeconfigs[name]}",
            f"--authentication-kubeconfig={self.kubeconfigs[name]}",
            f"--authorization-kubeconfig={self.kubeconfigs[name]}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p[name]}",
            f"--tls-cert-file={d / (name + '-serving.crt')}",
            f"--tls-private-key-file={d / (name + '-serving.key')}",
            f"--client-ca-file={pki.ca.cert}",
            "--leader-elect=false",
            "--profiling=false",
        ]
        if name == "kube-controller-manager":
            return [
                str(self.binaries.kube_controller_manager),
                *common,
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                "--cluster-name=zjusct-test",
                "--node-monitor-period=2s",
                f"--node-monitor-grace-period={self.node_grace_seconds}s",
            ]
        if name == "kube-scheduler":
            return [str(self.binaries.kube_scheduler), *common]
        raise ValueError(name)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.state_dir / "logs" / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_die_with_parent,
            )
        self.processes[name] = Process(name, argv, log, popen)

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        """Stop kube-apiserver (SIGTERM, then SIGKILL after 30 s) and start it again with the same arguments;
        returns once ``/readyz`` answers ok. Clients' watches break and must reconnect (a fault test's tool).

        Raises:
            ClusterError: it did not become ready within ``timeout`` seconds.
        """
        proc = self.processes["kube-apiserver"]
        proc.popen.terminate()
        try:
            proc.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=30)
        self._spawn("kube-apiserver", proc.argv)
        self._wait_https(f"{self.server}/readyz", "kube-apiserver after a restart", time.monotonic() + timeout,
                         client_cert=True)
        self._save_state()

    def _check_alive(self) -> None:
        for p in self.processes.values():
            if not p.alive():
                raise ClusterError(f"{p.name} exited during start-up; last log lines ({p.log}):\n{tail(p.log)}")

    def _wait(self, check: Callable[[], bool], what: str, deadline: float) -> None:
        last: Exception | None = None
        while True:
            self._check_alive()
            try:
                if check():
                    return
            except Exception as exc:  # not ready yet; keep the last error for the message
                last = exc
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{tail(p.log, 10)}" for p in self.processes.values())
                raise ClusterError(f"timed out waiting for {what} (last error: {last})\n{logs}")
            time.sleep(0.2)

    def _wait_https(self, url: str, what: str, deadline: float, client_cert: bool = False) -> None:
        assert self._pki is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca.cert))
        if client_cert:
            admin: KeyPair = KeyPair(self._pki.dir / "client-admin.crt", self._pki.dir / "client-admin.key")
            ctx.load_cert_chain(str(admin.cert), str(admin.key))

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:  # noqa: S310 (https of our own daemons)
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait(ok, f"{what} {url}", deadline)

    def _bootstrap_objects(self) -> None:
        from kubernetes import client

        api = self._admin()
        core: Any = client.CoreV1Api(api)
        for spec in self.nodes:
            core.create_node(node_manifest(spec, self.binaries.k8s_version))
        core.create_namespace(
            {"metadata": {"name": TENANT_NAMESPACE, "labels": {"cloud.zjusct.io/tenant": TENANT_USER}}}
        )
        rbac: Any = client.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "zjusct-test:kube-apiserver-kubelet-client"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:kubelet-api-admin",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT_USER}],
            }
        )
        rbac.create_namespaced_role_binding(
            TENANT_NAMESPACE,
            {
                "metadata": {"name": f"{TENANT_USER}-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT_USER}],
            },
        )

    def _start_heartbeat(self) -> None:
        clients = {spec.name: self.api_client(spec.name) for spec in self.nodes}
        self._clients.update({f"node:{k}": v for k, v in clients.items()})
        self._heartbeat = Heartbeat(clients, self.state_dir, self.heartbeat_interval)
        self._heartbeat.start()

    def _node_schedulable(self, node: str) -> bool:
        from kubernetes import client

        n: Any = client.CoreV1Api(self._admin()).read_node(node)
        ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        taints = {t.key for t in (n.spec.taints or [])}
        return ready and not taints & LIFECYCLE_TAINTS

    def _tenant_ready(self) -> bool:
        from kubernetes import client

        alice = self._clients.get(TENANT_USER) or self.api_client(TENANT_USER)
        self._clients[TENANT_USER] = alice
        authz: Any = client.AuthorizationV1Api(alice)
        review = authz.create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"namespace": TENANT_NAMESPACE, "verb": "create", "resource": "pods"}}}
        )
        if not review.status.allowed:
            return False
        client.CoreV1Api(self._admin()).read_namespaced_service_account("default", TENANT_NAMESPACE)
        return True

    def _save_state(self) -> None:
        state = {
            "version": 1,
            "state_dir": str(self.state_dir),
            "server": self.server,
            "k8s_version": self.binaries.k8s_version,
            "etcd_version": self.binaries.etcd_version,
            "ports": self.ports,
            "pids": {**self.pids(), "supervisor": os.getpid()},
            "kubeconfigs": {k: str(v) for k, v in self.kubeconfigs.items()},
            "audit_log": str(self.audit_log),
            "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
            "heartbeat_interval": self.heartbeat_interval,
            "timings": self.timings,
            "ready": "usable_s" in self.timings,
        }
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_dir / STATE_FILE)


_shared: dict[str, Any] = {"cluster": None, "users": 0}
_shared_lock = threading.Lock()


def acquire_shared(keep_state: bool = False) -> Cluster:
    """Return this process's shared cluster, starting it on first use (reference counted).

    Session fixtures re-exported by several conftest files are separate fixture definitions; this
    keeps them on one control plane per test session. Pair every call with :func:`release_shared`.

    Raises:
        ClusterError: the cluster could not be started (nothing is left running).
    """
    with _shared_lock:
        if _shared["cluster"] is None:
            _shared["cluster"] = Cluster(keep_state=keep_state).start()
        _shared["users"] += 1
        return _shared["cluster"]


def release_shared() -> None:
    """Drop one reference taken by :func:`acquire_shared`; stop the cluster when none is left."""
    with _shared_lock:
        _shared["users"] = max(0, _shared["users"] - 1)
        if _shared["users"] == 0 and _shared["cluster"] is not None:
            cluster, _shared["cluster"] = _shared["cluster"], None
            cluster.stop()


def sweep_stale_state_dirs(root: Path | None = None, min_age: float = 60.0) -> list[Path]:
    """Remove ``zjusct-k8s-*`` state dirs left behind by a killed session.

    A dir is stale when its state.json is older than ``min_age`` seconds and none of the pids it
    records is alive (the daemons die with their owner through PR_SET_PDEATHSIG; only the dir stays).

    Args:
        root: where to look (default: the temp dir).
        min_age: seconds; younger dirs are never touched.

    Returns:
        The removed directories.
    """
    removed = []
    for state_file in Path(root or tempfile.gettempdir()).glob(f"zjusct-k8s-*/{STATE_FILE}"):
        try:
            if time.time() - state_file.stat().st_mtime < min_age:
                continue
            pids = [int(p) for p in json.loads(state_file.read_text()).get("pids", {}).values()]
        except (OSError, ValueError):
            continue
        if not any(pid_alive(pid) for pid in pids):
            shutil.rmtree(state_file.parent, ignore_errors=True)
            removed.append(state_file.parent)
    return removed


def load_state(state_dir: Path) -> dict[str, Any]:
    """Read ``<state_dir>/state.json`` written by a running cluster.

    Raises:
        FileNotFoundError: no cluster state in ``state_dir``.
        json.JSONDecodeError: the state file is corrupt.
    """
    return dict(json.loads((state_dir / STATE_FILE).read_text()))


def stop_state_dir(state_dir: Path, remove: bool = True) -> list[str]:
    """Stop the processes recorded in ``state_dir`` by pid and remove the directory.

    Only pids whose command line still mentions ``state_dir`` are signalled (pid reuse guard).

    Returns:
        Names of processes that needed SIGKILL.

    Raises:
        FileNotFoundError: ``state_dir`` holds no cluster state.
    """
    state_dir = state_dir.resolve()
    state = load_state(state_dir)
    killed = []
    for stage in STOP_STAGES:  # the supervisor stops the rest itself; the later stages are a fallback
        pids = {n: int(state["pids"][n]) for n in stage if n in state["pids"]}
        killed += kill_pids(pids, str(state_dir))
    if remove:
        shutil.rmtree(state_dir, ignore_errors=True)
    return killed


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition", interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns a truthy value and return that value.

    Exceptions raised by ``check`` count as "not yet"; on timeout the error names the last exception, or else
    the last value ``check`` returned (so a timeout says what the test saw last).

    Args:
        check: the predicate.
        timeout: seconds before giving up.
        what: description used in the error.
        interval: seconds between polls.

    Raises:
        TimeoutError: ``check`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    seen: Any = None
    while True:
        try:
            seen = value = check()
            last = None
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else f" (last seen: {seen!r})"
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)
