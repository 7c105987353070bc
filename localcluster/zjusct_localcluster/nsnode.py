"""A real node in a network and mount namespace of its own: the node of a :class:`~.cluster.LocalCluster`.

:class:`NamespacedNode` is :class:`~.node.RealNode` (the same containerd and kubelet configuration, certificates,
images and teardown) with these differences, see :mod:`.hostnet` for the plumbing:

* its daemons run inside its namespaces (``nsenter --net --mount``), with the node IP 10.240.0.(10+I), kubelet on
  the fixed ports 10250/10248 of that address and ``cgroupRoot: /zjnode-<name>``;
* the CNI bridge ``cni0`` lives in the node's namespace; Pods get 10.244.I.0/24 and a default route through it;
* once the kubelet has registered, two more node agents start: **kube-proxy** (the release's own, iptables mode,
  identity ``system:kube-proxy`` bound to the built-in ``system:node-proxier``) and **kube-router**'s network
  policy controller (``--run-firewall`` only: no BGP router, no service proxy; identity ``system:kube-router``
  bound to the ClusterRole ``zjusct:kube-router`` the LocalCluster creates). Both write iptables rules and ipsets
  in the node's network namespace only;
* :meth:`lose` takes the node away as an operator trying failover would (``poweroff``: every agent, shim and
  container killed and the link cut; ``agents``: kubelet and containerd killed, containers running; ``partition``:
  the link cut, everything running) and :meth:`restore` brings it back with the same command lines.

It takes no machine lock itself (the LocalCluster holds it for all its nodes) and restores no host sysctl (the
LocalCluster does, once every node is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from . import hostnet
from .controlplane import LIFECYCLE_TAINTS, load_state, pid_alive, pid_is_ours
from .node import RealNode, RealNodeError
from .pki import PKI, write_kubeconfig

KUBE_PROXY_USER = "system:kube-proxy"
KUBE_ROUTER_USER = "system:kube-router"
KUBE_ROUTER_ROLE = "zjusct:kube-router"
# what each way of losing a node does (docs/kubernetes.md "Losing and restoring a node")
LOSS_MODES = {
    "poweroff": "every agent, shim and container SIGKILLed, the node's link down",
    "agents": "kubelet and containerd SIGKILLed; containers, kube-proxy, kube-router and the link stay",
    "partition": "the node's link down; every process keeps running",
}
AGENTS = ("containerd", "kubelet", "kube-proxy", "kube-router")
# kube-proxy has programmed the kubernetes Service (it has an endpoint: the API server on the host bridge)
KUBE_PROXY_SYNCED = '"default/kubernetes:https cluster IP"'
KUBE_ROUTER_CHAIN = ":KUBE-ROUTER-FORWARD"


class NamespacedNode(RealNode):
    """containerd + kubelet + kube-proxy + kube-router in the namespaces of ``addressing``.

    Args:
        cluster_state_dir: the control plane's state dir (``state.json``, ``pki/``).
        addressing: the node's names and addresses.
        peers: every node of the cluster (routes to their Pod CIDRs).
        work_dir: the node's directory (containerd root and state, kubelet root, CNI, logs, the bind sources);
            removed at :meth:`stop`.
        extra_images: docker-archives imported besides pause and busybox.
        die_with_parent: daemons get ``PR_SET_PDEATHSIG=SIGKILL``.
        taints: the taints the kubelet registers with (default none: the cluster is the node's own).
        kubelet_overrides: fields merged into the KubeletConfiguration last (e.g. ``maxPods``,
            ``systemReserved``: every node reports the whole machine as its capacity).
    """

    def __init__(self, cluster_state_dir: Path, addressing: hostnet.NodeAddressing,
                 peers: list[hostnet.NodeAddressing], work_dir: Path, extra_images: tuple[Path, ...] = (),
                 die_with_parent: bool = True, taints: tuple[dict[str, str], ...] = (),
                 kubelet_overrides: dict[str, Any] | None = None) -> None:
        super().__init__(cluster_state_dir, name=addressing.name, work_dir=work_dir, extra_images=extra_images,
                         die_with_parent=die_with_parent, take_lock=False, taints=taints)
        self.addressing = addressing
        self.peers = list(peers)
        self.kubelet_extra = dict(kubelet_overrides or {})

    # ------------------------------------------------------------------ RealNode hooks

    def _prepare_host(self) -> None:
        self.ip = self.addressing.ip
        self.sysctls_before = {}
        self.host_paths_before = {}
        self._save_state()  # the netns key is saved before any effect: teardown undoes a half-made node
        t0 = time.monotonic()
        try:
            hostnet.setup_node(self.addressing, self.peers, self.work / "bind")
        except hostnet.HostNetError as exc:
            raise RealNodeError(f"node {self.name}: {exc}") from exc
        self.timings["namespaces_s"] = time.monotonic() - t0

    def _enter(self) -> list[str]:
        return self.addressing.enter()

    def _cni_conf(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "zjusct-localcluster",
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.work / "cni" / "ipam"),
                         "ranges": [[{"subnet": self.addressing.pod_cidr,
                                      "gateway": self.addressing.pod_gateway}]],
                         # the bridge plugin gives the gateway to the bridge; the Pod's default route comes only
                         # from these routes (without it: "Network is unreachable")
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }

    def _kubelet_ports(self) -> tuple[int, int]:
        return 10250, 10248  # the node's own network namespace: the defaults collide with nothing

    def _kubelet_overrides(self) -> dict[str, Any]:
        return {"cgroupRoot": f"/{self.addressing.cgroup}", **self.kubelet_extra}

    def _extra_state(self) -> dict[str, Any]:
        return {"netns": self.addressing.netns, "index": self.addressing.index}

    def _after_registered(self, deadline: float) -> None:
        t0 = time.monotonic()
        self._write_agent_configs()
        # kube-proxy first: kube-router rewrites the whole filter table from a snapshot (iptables-save, then
        # -restore), so it starts once kube-proxy's chains are in; started together, a snapshot taken between
        # kube-proxy's chain and its jump rule dropped the chain and kube-proxy's sync failed (measured)
        self._spawn("kube-proxy", self._kube_proxy_argv(), self.work / "logs" / "kube-proxy.log")
        self._save_state()
        self._wait_agent("kube-proxy", deadline)
        self._spawn("kube-router", self._kube_router_argv(), self.work / "logs" / "kube-router.log")
        self._save_state()
        self._wait_agent("kube-router", deadline)
        self.timings["agents_s"] = time.monotonic() - t0

    # ------------------------------------------------------------------ kube-proxy, kube-router

    def _write_agent_configs(self) -> None:
        state = load_state(self.cluster_state_dir)
        pki = PKI.load(self.cluster_state_dir / "pki")
        node_dir = self.work / "node"
        pki.dir = node_dir
        for key, user in (("kube-proxy", KUBE_PROXY_USER), ("kube-router", KUBE_ROUTER_USER)):
            pair = pki.issue(f"{key}-client", user, client=True)
            write_kubeconfig(node_dir / f"{key}.kubeconfig", state["server"], pki.ca, pair, user)
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(node_dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": hostnet.CLUSTER_CIDR,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "nodePortAddresses": ["primary"],  # NodePorts on the node IP only
            # 0: leave the conntrack table size and timeouts alone (nf_conntrack_max is machine-wide)
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (node_dir / "kube-proxy-config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    def _kube_proxy_argv(self) -> list[str]:
        return [str(self.binaries.kube_proxy), f"--config={self.work / 'node' / 'kube-proxy-config.json'}", "--v=1"]

    def _kube_router_argv(self) -> list[str]:
        return [
            str(self.binaries.kube_router),
            f"--kubeconfig={self.work / 'node' / 'kube-router.kubeconfig'}",
            f"--hostname-override={self.name}",
            "--run-firewall=true",
            "--run-router=false",  # no BGP (routes are static, see hostnet), so no GoBGP gRPC port either
            "--run-service-proxy=false",  # kube-proxy is the service proxy
            "--enable-cni=false",
            f"--service-cluster-ip-range={hostnet.SERVICE_CIDR}",
            "--health-port=20244",
            "--metrics-port=0",
            "--v=1",
        ]

    def iptables_save(self, table: str = "filter") -> str:
        """``iptables-save -t <table>`` inside the node's network namespace.

        Raises:
            subprocess.CalledProcessError: iptables-save failed.
        """
        return subprocess.run(["nsenter", f"--net={self.addressing.netns_path}", "--", "iptables-save", "-t", table],
                              capture_output=True, text=True, timeout=30, check=True).stdout

    def _agent_synced(self, name: str) -> bool:
        if name == "kube-proxy":
            return KUBE_PROXY_SYNCED in self.iptables_save("nat")
        return KUBE_ROUTER_CHAIN in self.iptables_save("filter")

    def _wait_agent(self, name: str, deadline: float) -> None:
        what = (f"kube-proxy ({KUBE_PROXY_SYNCED} in the nat table)" if name == "kube-proxy"
                else f"kube-router ({KUBE_ROUTER_CHAIN} in the filter table)")
        self._wait(lambda: self._agent_synced(name), f"{what} on {self.name}", deadline,
                   self.work / "logs" / f"{name}.log")

    # ------------------------------------------------------------------ losing and restoring

    def running(self) -> dict[str, bool]:
        """``{agent: alive}`` for containerd, kubelet, kube-proxy and kube-router, and ``link`` (the node's veth is
        up)."""
        out = {name: name in self.pids and pid_is_ours(self.pids[name], str(self.work)) for name in AGENTS}
        out["link"] = hostnet.link_up(self.addressing)
        return out

    def lose(self, how: str = "poweroff") -> None:
        """Take the node away (see :data:`LOSS_MODES`); the control plane then marks it NotReady and taints it
        ``node.kubernetes.io/unreachable`` after its grace period.

        Raises:
            ValueError: ``how`` is not one of :data:`LOSS_MODES`.
        """
        if how not in LOSS_MODES:
            raise ValueError(f"how={how!r}: must be one of {', '.join(LOSS_MODES)}")
        if how in ("poweroff", "partition"):
            hostnet.set_link(self.addressing, up=False)
        victims = {"agents": ("kubelet", "containerd"), "poweroff": ("kube-router", "kube-proxy", "kubelet",
                                                                      "containerd")}.get(how, ())
        for name in victims:
            self._sigkill(name)
        if how == "poweroff":
            sock = f"-address {self.sock}"
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit() and pid_is_ours(int(proc.name), sock):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(proc.name), signal.SIGKILL)
            hostnet.kill_cgroup_pids(self.addressing)
        self._save_state()

    def _sigkill(self, name: str) -> None:
        popen = self.popens.get(name)
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait(timeout=30)
        elif name in self.pids and pid_is_ours(self.pids[name], str(self.work)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pids[name], signal.SIGKILL)

    def restore(self, timeout: float = 300.0) -> None:
        """Bring the node back after :meth:`lose`: link up, routes ensured, every agent that is not running started
        again with its command line, then wait until the Node is Ready without lifecycle taints and kube-proxy and
        kube-router have synced.

        Raises:
            RealNodeError: an agent exited or the node did not get Ready within ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        hostnet.set_link(self.addressing, up=True)
        hostnet.ensure_routes(self.addressing, self.peers)
        alive = self.running()
        for name in AGENTS:  # the dead ones' handles go first: _wait fails on any handle that has exited
            if not alive[name]:
                popen = self.popens.pop(name, None)
                if popen is not None:
                    popen.wait(timeout=30)
        for name in AGENTS:  # in start()'s order: containerd serving, the Node Ready, kube-proxy, kube-router
            if not alive[name]:
                self._spawn(name, self.argvs[name], self.work / "logs" / f"{name}.log")
                self._save_state()
            if name == "containerd":
                self._wait(lambda: self._ctr(["version"], check=False).returncode == 0, "containerd serving",
                           deadline, self.containerd_log)
            elif name == "kubelet":
                self._wait(self._ready_again, f"Node {self.name} Ready without lifecycle taints", deadline,
                           self.kubelet_log)
            else:
                self._wait_agent(name, deadline)

    def _ready_again(self) -> bool:
        """Ready, and the node lifecycle controller's taints (not-ready, unreachable) gone. Taints an operator set
        while the node was lost (``node.kubernetes.io/out-of-service``, a cordon) stay: removing them is the
        operator's step once the node is back (KEP-2268)."""
        n = self._core_cached().read_node(self.name)
        ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        return ready and not {t.key for t in (n.spec.taints or [])} & LIFECYCLE_TAINTS

    def rss_kib(self) -> dict[str, int]:
        """Resident set size (KiB) of each agent now (``VmRSS``)."""
        out = {}
        for name, pid in self.pids.items():
            if pid_alive(pid):
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            out[name] = int(line.split()[1])
        return out
