"""The network, mount and cgroup plumbing that gives each real node of a :class:`~.cluster.LocalCluster` a machine
of its own on this one host (the design measured in docs/kubernetes.md "How the nodes are made").

Addresses (fixed: one local cluster per machine, under the real-node lock):

* the host bridge :data:`BRIDGE` ``zjnbr0`` with :data:`HOST_IP` 10.240.0.1/24, where kube-apiserver and Ceph
  listen;
* node ``I`` (1, 2, 3): network namespace ``zjnode-<name>``, a veth ``zjn-<name>`` (host side, a port of the
  bridge) / ``eth0`` (node side) with 10.240.0.(10+I)/24 and a default route via 10.240.0.1; its Pod CIDR
  10.244.I.0/24 behind a CNI bridge ``cni0`` inside the namespace;
* routes: the host reaches node I's Pods through ``10.244.I.0/24 via 10.240.0.(10+I)``; every node routes every
  other node's Pod CIDR straight to that node over the shared bridge, so the host forwards nothing (its
  ``net.ipv4.ip_forward`` is never touched; each node namespace forwards, with ``ip_forward`` and
  ``bridge-nf-call-iptables`` set inside the namespace only).

Mounts: kubelet, containerd and libcni keep some paths whatever their configuration says (:data:`HOST_PATHS`).
Each node gets its own mount namespace (``unshare --mount=<file> --propagation private``, pinned by a bind mount
of the namespace file under :data:`MNT_DIR`, itself a private mount) with per-node directories bind-mounted over
those paths. On the host they are only empty mount points, created when absent and removed again at teardown.
Daemons enter both namespaces with ``nsenter --net --mount`` — not ``ip netns exec``, which remounts ``/sys`` and
hides ``/sys/fs/cgroup``.

cgroups: kubelet's ``cgroupRoot`` is ``/zjnode-<name>``, created here in every v1 hierarchy (and the unified one)
with cpuset.cpus/mems copied from the root, because kubelet refuses a missing cgroup root.

Everything here is an effect (ip, nsenter, unshare, mount, sysfs writes); the addresses are computed by
:class:`NodeAddressing`, which does no I/O. Commands get argument lists, never a shell string.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "zjnbr0"
HOST_IP = "10.240.0.1"
NODE_NETWORK = "10.240.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
MNT_DIR = Path("/run/zjusct-localcluster")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubelet (device-plugins socket, /var/log/containers links, /var/log/pods), libcni (its result cache) and
# containerd 1.6 (shim sockets and the runc root under /run/containerd) use these whatever they are configured with
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
)
# sysctls kubelet writes on the host (the same values from every kubelet): restored at teardown
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
MAX_NODES = 3
# a Linux interface name has at most 15 bytes: "zjn-" + the node name
NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,9}[a-z0-9])?$")


class HostNetError(RuntimeError):
    """A host or node namespace step failed; the message names the command and its error output."""


@dataclass(frozen=True)
class NodeAddressing:
    """Names and addresses of node ``index`` (1-based) called ``name`` (pure: no I/O).

    Raises:
        ValueError: ``name`` is not a DNS label of at most 11 characters, or ``index`` is outside 1..MAX_NODES.
    """

    name: str
    index: int

    def __post_init__(self) -> None:
        if not NODE_NAME_RE.match(self.name):
            raise ValueError(f"node name {self.name!r}: must be lower-case letters, digits and '-', 1-11 "
                             "characters, starting and ending with a letter or digit (it names a network "
                             "interface zjn-<name>, at most 15 bytes)")
        if not 1 <= self.index <= MAX_NODES:
            raise ValueError(f"node index {self.index}: must be 1..{MAX_NODES}")

    @property
    def ip(self) -> str:
        """The node IP (InternalIP), 10.240.0.(10+index)."""
        return str(ipaddress.ip_address(HOST_IP) + 9 + self.index)

    @property
    def pod_cidr(self) -> str:
        """The node's Pod CIDR, 10.244.<index>.0/24."""
        return f"10.244.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The node-side address of the node's CNI bridge, 10.244.<index>.1."""
        return f"10.244.{self.index}.1"

    @property
    def netns(self) -> str:
        """The network namespace name (``/run/netns/<netns>``)."""
        return f"zjnode-{self.name}"

    @property
    def netns_path(self) -> Path:
        """The network namespace file."""
        return Path("/run/netns") / self.netns

    @property
    def veth(self) -> str:
        """The host side of the node's veth pair (a port of :data:`BRIDGE`)."""
        return f"zjn-{self.name}"

    @property
    def mnt_file(self) -> Path:
        """The bind mount that pins the node's mount namespace."""
        return MNT_DIR / f"{self.name}.mnt"

    @property
    def cgroup(self) -> str:
        """kubelet's ``cgroupRoot`` without the leading slash."""
        return f"zjnode-{self.name}"

    def enter(self) -> list[str]:
        """The command prefix that runs a command in the node's network and mount namespaces."""
        return ["nsenter", f"--net={self.netns_path}", f"--mount={self.mnt_file}", "--"]


def node_addressing(count: int, names: list[str] | None = None) -> list[NodeAddressing]:
    """The addressing of ``count`` nodes named ``names`` (default ``node-1`` .. ``node-<count>``).

    Raises:
        ValueError: ``count`` is outside 1..MAX_NODES, ``names`` has another length or a duplicate, or a name is
            invalid (see :class:`NodeAddressing`).
    """
    if not 1 <= count <= MAX_NODES:
        raise ValueError(f"--nodes {count}: must be 1..{MAX_NODES} (every node reports the whole machine and "
                         "costs about 150 MB; 3 is what this 2-core machine is measured with)")
    names = names or [f"node-{i}" for i in range(1, count + 1)]
    if len(names) != count or len(set(names)) != count:
        raise ValueError(f"node names {names}: need {count} distinct names")
    return [NodeAddressing(name, i) for i, name in enumerate(names, start=1)]


# --------------------------------------------------------------------------- commands


def run(argv: list[str], check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell) and return the result.

    Raises:
        HostNetError: ``check`` and the command failed (its stderr in the message).
    """
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise HostNetError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: tuple[str, ...]) -> dict[str, str]:
    """The current values of host sysctls ``names``."""
    return {name: _sysctl_path(name).read_text().strip() for name in names}


def restore_sysctls(values: dict[str, str]) -> None:
    """Write back ``values`` (from :func:`read_sysctls`) where they changed."""
    for name, value in values.items():
        with contextlib.suppress(OSError):
            if _sysctl_path(name).read_text().strip() != value:
                _sysctl_path(name).write_text(value + "\n")


# --------------------------------------------------------------------------- host side


def link_exists(name: str) -> bool:
    """True if a network interface ``name`` exists in the host namespace."""
    return Path("/sys/class/net", name).exists()


def setup_host() -> list[str]:
    """Create the host bridge with :data:`HOST_IP`, the private mount under :data:`MNT_DIR` and the empty mount
    points of :data:`HOST_PATHS` that do not exist yet.

    Returns:
        The host paths created here (to remove at :func:`teardown_host`).

    Raises:
        HostNetError: a command failed.
    """
    if link_exists(BRIDGE):  # a leftover of a killed run: the machine lock says no cluster uses it now
        run(["ip", "link", "del", BRIDGE])
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    MNT_DIR.mkdir(parents=True, exist_ok=True)
    if str(MNT_DIR) not in _mountpoints():
        run(["mount", "--bind", str(MNT_DIR), str(MNT_DIR)])
        run(["mount", "--make-private", str(MNT_DIR)])
    created = []
    for path in HOST_PATHS:
        if not path.exists():
            path.mkdir(parents=True)
            created.append(str(path))
    return created


def teardown_host(created_paths: list[str]) -> None:
    """Undo :func:`setup_host`: delete the bridge, unmount and remove :data:`MNT_DIR` and remove the host paths
    it created (they are empty mount points; a non-empty one is kept and left for the operator)."""
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE], check=False)
    for mnt in sorted((m for m in _mountpoints() if m == str(MNT_DIR) or m.startswith(f"{MNT_DIR}/")),
                      key=len, reverse=True):
        run(["umount", mnt], check=False)
    with contextlib.suppress(OSError):
        for leftover in MNT_DIR.iterdir():
            leftover.unlink()
        MNT_DIR.rmdir()
    for path in created_paths:
        with contextlib.suppress(OSError):
            Path(path).rmdir()


def _mountpoints() -> set[str]:
    with contextlib.suppress(OSError):
        return {line.split()[4].replace("\\040", " ")
                for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return set()


# --------------------------------------------------------------------------- one node


def setup_node(node: NodeAddressing, peers: list[NodeAddressing], bind_dir: Path) -> None:
    """Make node ``node``'s network namespace, veth, routes, mount namespace and cgroup root.

    Args:
        node: the node.
        peers: every node of the cluster (routes to the other ones' Pod CIDRs).
        bind_dir: the node's own directories, one per :data:`HOST_PATHS` entry (``var-lib-kubelet``, ...),
            created here and bind-mounted over those paths inside the node's mount namespace.

    Raises:
        HostNetError: a command failed (the caller tears the node down).
    """
    teardown_node(node)  # leftovers of a killed run under the same name
    ns = node.netns
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", node.veth, "master", BRIDGE, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    ensure_routes(node, peers)
    # the node routes between eth0 and its Pods' bridge; kube-proxy and kube-router filter bridged Pod traffic
    for key in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
        run(["nsenter", f"--net={node.netns_path}", "--", "sysctl", "-q", "-w", key])
    # the mount namespace: created by the first bind, the others entered
    node.mnt_file.touch()
    first = True
    for host_path in HOST_PATHS:
        own = bind_dir / host_path.relative_to("/").as_posix().replace("/", "-")
        own.mkdir(parents=True, exist_ok=True)
        if first:
            run(["unshare", f"--mount={node.mnt_file}", "--propagation", "private", "--",
                 "mount", "--bind", str(own), str(host_path)])
            first = False
        else:
            run(["nsenter", f"--mount={node.mnt_file}", "--", "mount", "--bind", str(own), str(host_path)])
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / node.cgroup
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((hierarchy / knob).read_text())


def ensure_routes(node: NodeAddressing, peers: list[NodeAddressing]) -> None:
    """(Re)install the node's default route, its routes to the other nodes' Pod CIDRs and the host's route to
    its Pod CIDR (``ip route replace``: idempotent, also after the node's link was down)."""
    run(["ip", "-n", node.netns, "route", "replace", "default", "via", HOST_IP])
    for peer in peers:
        if peer.name != node.name:
            run(["ip", "-n", node.netns, "route", "replace", peer.pod_cidr, "via", peer.ip])
    run(["ip", "route", "replace", node.pod_cidr, "via", node.ip, "dev", BRIDGE])


def set_link(node: NodeAddressing, up: bool) -> None:
    """Cut (``up=False``) or restore the node's network: its veth on the host bridge goes down or up.

    Raises:
        HostNetError: ``ip link set`` failed.
    """
    run(["ip", "link", "set", node.veth, "up" if up else "down"])


def link_up(node: NodeAddressing) -> bool:
    """True if the node's veth is administratively up."""
    try:
        flags = int(Path("/sys/class/net", node.veth, "flags").read_text(), 16)
    except OSError:
        return False
    return bool(flags & 0x1)


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy under /sys/fs/cgroup (v1 controllers and the unified one; symlinks such as
    ``cpu -> cpu,cpuacct`` skipped)."""
    mounts = _mountpoints()
    return sorted(p for p in CGROUP_ROOT.iterdir() if not p.is_symlink() and str(p) in mounts)


def cgroup_pids(node: NodeAddressing) -> set[int]:
    """Every pid in the node's cgroups (its Pods' processes: pause, containers)."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / node.cgroup
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroup_pids(node: NodeAddressing, timeout: float = 10.0) -> int:
    """SIGKILL every process in the node's cgroups (containers outlive a killed containerd and its shims) and
    wait until they are gone.

    Returns:
        How many processes were signalled.
    """
    signalled: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = cgroup_pids(node)
        if not pids or time.monotonic() > deadline:
            return len(signalled)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        signalled |= pids
        time.sleep(0.1)


def teardown_node(node: NodeAddressing) -> None:
    """Undo :func:`setup_node` (safe on a node that was never, or only partly, set up): the processes in its
    cgroups are killed, the mount namespace pin is unmounted (the namespace and every mount in it go with its last
    process), the network namespace deleted (its veth with it), the host route removed and the cgroups removed
    depth-first. The node's daemons must be stopped before."""
    kill_cgroup_pids(node)
    if node.mnt_file.exists():
        run(["umount", str(node.mnt_file)], check=False)
        with contextlib.suppress(OSError):
            node.mnt_file.unlink()
    if node.netns_path.exists():
        run(["ip", "netns", "del", node.netns], check=False)
    if link_exists(node.veth):
        run(["ip", "link", "del", node.veth], check=False)
    run(["ip", "route", "del", node.pod_cidr], check=False)
    deadline = time.monotonic() + 10
    while True:
        left = []
        for hierarchy in cgroup_hierarchies():
            root = hierarchy / node.cgroup
            if root.is_dir():
                for d in sorted((d for d in [root, *root.rglob("*")] if d.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
                    try:
                        d.rmdir()
                    except OSError:
                        left.append(d)
        if not left or time.monotonic() > deadline:
            return
        kill_cgroup_pids(node, timeout=2)
        time.sleep(0.2)


# --------------------------------------------------------------------------- what is left on the host


def host_footprint(markers: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Everything on this host that a local cluster makes, by the names it uses (not other software's): links
    (:data:`BRIDGE`, ``zjn-*``), network namespaces (``zjnode-*``), routes to :data:`CLUSTER_CIDR` or via the
    bridge, mounts under :data:`MNT_DIR` or :data:`HOST_PATHS` or naming a marker, which :data:`HOST_PATHS` exist,
    cgroups ``zjnode-*``, processes whose command line names a marker (e.g. the state dir), host iptables/nft rules
    naming kube-proxy's or kube-router's chains or the cluster's ranges, and the host sysctls kubelet writes plus
    ``net.ipv4.ip_forward``. Equal before ``up`` and after ``down`` means nothing was left behind.

    Args:
        markers: strings whose presence in a mount or command line marks it as the cluster's.
    """
    out: dict[str, list[str]] = {}
    out["links"] = sorted(n for n in os.listdir("/sys/class/net") if n == BRIDGE or n.startswith("zjn-"))
    out["netns"] = sorted(n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
                          if n.startswith("zjnode-"))
    routes = run(["ip", "-4", "route", "show"], check=False).stdout.splitlines()
    out["routes"] = sorted(r for r in routes if r.startswith("10.244.") or f"dev {BRIDGE}" in r)
    watched = (str(MNT_DIR), *(str(p) for p in HOST_PATHS), *markers)
    out["mounts"] = sorted(m for m in _mountpoints() if any(m == w or m.startswith(w + "/") for w in watched))
    out["host_paths"] = sorted(str(p) for p in HOST_PATHS if p.exists())
    out["cgroups"] = sorted(str(p) for h in cgroup_hierarchies() for p in h.glob("zjnode-*"))
    procs = []
    if markers:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                with contextlib.suppress(OSError):
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if any(m in cmd for m in markers):
                        procs.append(cmd.strip()[:200])
    out["processes"] = sorted(procs)
    rules = run(["iptables-save"], check=False).stdout + run(["nft", "list", "ruleset"], check=False).stdout
    out["firewall"] = sorted({line.strip() for line in rules.splitlines()
                              if any(k in line for k in ("KUBE-", "10.244.", "10.96.", BRIDGE))})
    out["sysctls"] = [f"{k}={v}" for k, v in read_sysctls((*KUBELET_SYSCTLS, "net.ipv4.ip_forward")).items()]
    return out
