"""A real node for the test control plane: containerd + kubelet on this machine, joined to a running
:class:`~.controlplane.Cluster` with its own node certificate, so Pods actually run.

What :meth:`RealNode.start` sets up (everything under one work directory ``W`` unless said otherwise):

* the images ``localhost/zjusct/pause:<key>`` (a static pause binary built with gcc from
  ``images/pause.c`` beside this module) and ``localhost/zjusct/busybox:<key>`` (the host's busybox-static and one
  link per applet), written as docker-archives with ``roles/launcher_image/files/docker_archive.py`` and cached in
  ``${ZJUSCT_CACHE}/real-node/images/<key>/`` (key = hash of those inputs);
* containerd (Debian's 1.6) with its root, state and sockets in ``W/containerd``, CRI plugin with
  ``restrict_oom_score_adj`` (this machine drops CAP_SYS_RESOURCE: without it every sandbox fails) and Pod netns
  mounts under its state dir; the images are imported into its ``k8s.io`` namespace;
* a CNI bridge ``cni-zjusct0`` (host side 10.233.0.1/24, ``isGateway``: the test host reaches Pod IPs directly,
  no NAT, Pod IPs 10.233.0.2-254 from host-local IPAM in ``W/cni``);
* kubelet (the pinned release from ``hack/build-k8s.sh``) with a client certificate ``system:node:<name>`` and a
  serving certificate for the node IP, both issued by the cluster CA; x509 + webhook authentication and webhook
  authorization (kube-apiserver's kubelet client certificate is bound to ``system:kubelet-api-admin``);
  ``failCgroupV1: false`` (these machines are cgroup v1); ``allowedUnsafeSysctls: [net.ipv4.ip_forward]`` (a
  launcher Pod routes to its guest's TAP).

One real node per machine at a time: kubelet and containerd use fixed host paths besides ``W``
(``/var/lib/kubelet/device-plugins``, ``/var/log/containers``, ``/var/lib/cni``, ``/run/containerd``, the
``kubepods`` cgroups), so :meth:`start` takes ``/run/lock/zjusct-real-node.lock`` (exclusive flock, waiting up
to ``lock_timeout`` s) and keeps it until :meth:`stop`.

:meth:`stop` (also after a failed start, also by ``python -m tests.cluster node-down`` from the saved state) stops
kubelet, kills every container task, stops containerd and its shims, unmounts everything under ``W``, deletes
the CNI bridge, removes the host paths above that did not exist before, removes the ``kubepods`` cgroups and
restores the sysctls kubelet and the bridge plugin change (``vm.overcommit_memory``, ``kernel.panic``,
``kernel.panic_on_oops``, ``net.ipv4.ip_forward``) to their values before start.

The Node objects of the cluster's heartbeat stay (scale tests). The real node registers with the taint
``cloud.zjusct.io/real-node=true:NoSchedule`` so that only Pods meant for it land there: they carry
:meth:`RealNode.pod_placement` (``nodeSelector: {kubernetes.io/hostname: <name>}`` plus the toleration). The Node
object is deleted at stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from . import hostnet
from .binaries import REPO, Binaries, cache_root
from .controlplane import _die_with_parent, _load_libc, free_ports, kill_pids, load_state, pid_alive, pid_is_ours, tail
from .pki import PKI, write_kubeconfig

LOCK_PATH = Path("/run/lock/zjusct-real-node.lock")
NODE_NAME = "real-node"
STATE_FILE = "real-node.json"
BRIDGE = "cni-zjusct0"
POD_SUBNET = "10.233.0.0/24"
POD_GATEWAY = "10.233.0.1"
PAUSE_SOURCE = Path(__file__).resolve().parent / "images" / "pause.c"
ARCHIVE_WRITER = REPO / "roles" / "launcher_image" / "files" / "docker_archive.py"
BUSYBOX = Path("/bin/busybox")
# sysctls kubelet sets (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1) and the bridge plugin
# with isGateway (net.ipv4.ip_forward=1); restored at stop
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward")
# host paths kubelet/containerd/libcni use whatever their configured directories are
HOST_PATHS = (Path("/var/lib/kubelet"), Path("/var/log/containers"), Path("/var/lib/cni"), Path("/run/containerd"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Registered with the node: only Pods that tolerate it land here, so tests sharing the control plane (scheduling
# onto node-a/node-b) never get a Pod placed on the real node.
TAINT_KEY = "cloud.zjusct.io/real-node"


class RealNodeError(RuntimeError):
    """The real node could not be started (the message names the step and carries log lines)."""


def archive_writer() -> ModuleType:
    """Import ``roles/launcher_image/files/docker_archive.py`` (the role ships it as a script)."""
    spec = importlib.util.spec_from_file_location("zjusct_docker_archive", ARCHIVE_WRITER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def node_images(cache: Path | None = None) -> dict[str, Path | str]:
    """Build (or reuse) the pause and busybox docker-archives; return their tags and paths.

    Returns:
        ``{"pause": tag, "pause_archive": path, "busybox": tag, "busybox_archive": path}``.

    Raises:
        RealNodeError: gcc or busybox-static is missing, or the build failed.
    """
    if shutil.which("gcc") is None:
        raise RealNodeError("gcc not installed (hack/apt-packages.txt: gcc, libc6-dev): needed for the pause binary")
    if not BUSYBOX.is_file():
        raise RealNodeError(f"{BUSYBOX} missing (package busybox-static)")
    key = _sha(PAUSE_SOURCE.read_bytes(), ARCHIVE_WRITER.read_bytes(), BUSYBOX.read_bytes())
    out = (cache or cache_root()) / "real-node" / "images" / key
    pause_tag, busybox_tag = f"localhost/zjusct/pause:{key}", f"localhost/zjusct/busybox:{key}"
    result: dict[str, Path | str] = {
        "pause": pause_tag,
        "pause_archive": out / "pause.tar",
        "busybox": busybox_tag,
        "busybox_archive": out / "busybox.tar",
    }
    if (out / "done").exists():
        return result
    out.mkdir(parents=True, exist_ok=True)
    writer = archive_writer()
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
        root = Path(tmp) / "pause-root"
        root.mkdir()
        proc = subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(root / "pause"), str(PAUSE_SOURCE)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if proc.returncode != 0:
            raise RealNodeError(f"gcc -static pause.c failed: {proc.stderr.strip()}")
        writer.write_archive(root, pause_tag, out / "pause.tar", entrypoint=["/pause"])
        bb = Path(tmp) / "busybox-root"
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "root"):
            (bb / d).mkdir(parents=True)
        (bb / "tmp").chmod(0o1777)
        shutil.copy2(BUSYBOX, bb / "bin" / "busybox")
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
        for applet in applets.split():
            if applet != "busybox" and "/" not in applet:
                (bb / "bin" / applet).symlink_to("busybox")
        (bb / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (bb / "etc" / "group").write_text("root:x:0:\n")
        writer.write_archive(bb, busybox_tag, out / "busybox.tar", cmd=["/bin/sh"])
    (out / "done").write_text(json.dumps({k: str(v) for k, v in result.items()}) + "\n")
    return result


def take_machine_lock(holder: str, timeout: float) -> int:
    """Take :data:`LOCK_PATH` (exclusive flock; one real node, or one local cluster, per machine), waiting up to
    ``timeout`` s; the file then names this pid and ``holder``. Release it by closing the returned descriptor.

    Raises:
        TimeoutError: another holder kept it for ``timeout`` s (the message names it).
    """
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                other = os.pread(fd, 200, 0).decode(errors="replace").strip()
                os.close(fd)
                raise TimeoutError(f"another real node holds {LOCK_PATH} for more than {timeout}s: {other}") from None
            time.sleep(1)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} {holder}\n".encode(), 0)
    return fd


def node_ip() -> str:
    """The host's source address towards 1.1.1.1 (the default route's; a route lookup, no traffic): the node IP.

    Raises:
        RealNodeError: there is no IPv4 default route.
    """
    out = subprocess.run(["ip", "-4", "-j", "route", "get", "1.1.1.1"], capture_output=True, text=True,
                         check=False).stdout
    try:
        return str(json.loads(out)[0]["prefsrc"])
    except (ValueError, IndexError, KeyError) as exc:
        raise RealNodeError(f"no IPv4 default route to take the node IP from ({out.strip()!r})") from exc


def _read_sysctl(name: str) -> str:
    return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / name.replace(".", "/")).write_text(value + "\n")


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == str(path) or mnt.startswith(prefix):
                found.append(mnt)
    return sorted(set(found), key=len, reverse=True)


class RealNode:
    """containerd + kubelet on this machine joined to the cluster whose state dir is ``cluster_state_dir``.

    Args:
        cluster_state_dir: the :class:`~.controlplane.Cluster` state dir (``state.json``, ``pki/``).
        name: the Node name (client certificate CN ``system:node:<name>``).
        work_dir: directory for everything the node writes (default: a new ``/tmp/zjusct-node-*``); removed by
            :meth:`stop`.
        extra_images: docker-archive files imported into containerd besides pause and busybox.
        lock_timeout: seconds to wait for another real node on this machine to go away.
        die_with_parent: daemons get ``PR_SET_PDEATHSIG=SIGKILL`` (they die with the owning process).
        take_lock: take the machine lock in :meth:`start` (a :class:`~.cluster.LocalCluster` holds it for all
            its nodes and passes False).
        taints: the taints the kubelet registers the Node with (default: ``cloud.zjusct.io/real-node=true:
            NoSchedule``, so that Pods of tests sharing the control plane never land here).
    """

    def __init__(self, cluster_state_dir: Path, name: str = NODE_NAME, work_dir: Path | None = None,
                 extra_images: tuple[Path, ...] = (), lock_timeout: float = 900.0,
                 die_with_parent: bool = True, take_lock: bool = True,
                 taints: tuple[dict[str, str], ...] | None = None) -> None:
        self.cluster_state_dir = cluster_state_dir.resolve()
        self.name = name
        self._own_work = work_dir is None
        self.work = Path(work_dir or tempfile.mkdtemp(prefix="zjusct-node-")).resolve()
        self.extra_images = tuple(extra_images)
        self.lock_timeout = lock_timeout
        self.die_with_parent = die_with_parent
        self.take_lock = take_lock
        self.taints = tuple(taints) if taints is not None else (
            {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},)
        self.argvs: dict[str, list[str]] = {}
        self.binaries = Binaries.pinned()
        self.ip = ""
        self.images: dict[str, Path | str] = {}
        self.pids: dict[str, int] = {}
        self.popens: dict[str, subprocess.Popen[bytes]] = {}
        self.timings: dict[str, float] = {}
        self.sysctls_before: dict[str, str] = {}
        self.host_paths_before: dict[str, bool] = {}
        self._lock_fd: int | None = None
        self._stopped = False

    @staticmethod
    def missing_reason() -> str | None:
        """What a real node lacks on this machine (root, containerd, runc, ctr, CNI plugins, kubelet), or None."""
        missing = [] if os.geteuid() == 0 else ["root"]
        missing += [t for t in ("containerd", "runc", "ctr") if shutil.which(t) is None]
        if not Path("/usr/lib/cni/bridge").exists():
            missing.append("/usr/lib/cni/bridge (containernetworking-plugins)")
        if missing:
            missing = [f"{', '.join(missing)} (hack/install-deps.sh)"]
        reason = Binaries.pinned().kubelet_missing_reason()
        if reason:
            missing.append(reason)
        return "; ".join(missing) or None

    # ------------------------------------------------------------------ paths

    @property
    def sock(self) -> Path:
        """containerd's gRPC socket."""
        return self.work / "containerd" / "containerd.sock"

    @property
    def kubelet_log(self) -> Path:
        """kubelet's log file."""
        return self.work / "logs" / "kubelet.log"

    @property
    def containerd_log(self) -> Path:
        """containerd's log file."""
        return self.work / "logs" / "containerd.log"

    def pod_node_selector(self) -> dict[str, str]:
        """``nodeSelector`` that places a Pod on this node."""
        return {"kubernetes.io/hostname": self.name}

    def pod_placement(self) -> dict[str, Any]:
        """Pod spec fields that place a Pod on this node: the ``nodeSelector`` and the toleration of its taint."""
        return {
            "nodeSelector": self.pod_node_selector(),
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        }

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 300.0) -> RealNode:
        """Take the machine lock, start containerd and kubelet, wait until the Node is Ready without taints.

        ``timings`` gets ``containerd_s`` (spawn -> serving), ``images_s`` (build/reuse + import),
        ``registered_s`` and ``ready_s`` (kubelet spawn -> Node object exists / Ready and untainted).

        Raises:
            RealNodeError: a component is missing, failed or timed out; everything is torn down when raised.
            TimeoutError: the lock stayed held by another real node for ``lock_timeout`` s.
        """
        reason = self.missing_reason()
        if reason:
            raise RealNodeError(reason)
        try:
            if self.take_lock:
                self._take_lock()
        except BaseException:
            if self._own_work:
                shutil.rmtree(self.work, ignore_errors=True)
            raise
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _take_lock(self) -> None:
        self._lock_fd = take_machine_lock(f"work {self.work}", self.lock_timeout)

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        _load_libc()
        for sub in ("logs", "containerd", "cni/net.d", "cni/ipam", "node", "kubelet-root", "pod-logs"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self._prepare_host()
        self._save_state()
        t0 = time.monotonic()
        self.images = node_images()
        self._write_containerd_config()
        self._write_cni()
        t1 = time.monotonic()
        self._spawn("containerd", ["containerd", "--config", str(self.work / "containerd" / "config.toml")],
                    self.containerd_log)
        self._wait(lambda: self._ctr(["version"], check=False).returncode == 0, "containerd serving", deadline,
                   self.containerd_log)
        self.timings["containerd_s"] = time.monotonic() - t1
        for archive in (self.images["pause_archive"], self.images["busybox_archive"], *self.extra_images):
            self.import_image(Path(archive))
        self.timings["images_s"] = time.monotonic() - t0 - self.timings["containerd_s"]
        self._write_kubelet_config()
        self._save_state()
        t2 = time.monotonic()
        self._spawn("kubelet", self._kubelet_argv(), self.kubelet_log)
        self._save_state()
        core = self._core()
        self._wait(lambda: core.read_node(self.name) is not None, f"Node {self.name} registered", deadline,
                   self.kubelet_log)
        self.timings["registered_s"] = time.monotonic() - t2
        self._after_registered(deadline)
        self._wait(self._ready, f"Node {self.name} Ready without taints", deadline, self.kubelet_log)
        self.timings["ready_s"] = time.monotonic() - t2
        self._save_state()

    def _prepare_host(self) -> None:
        """Before any daemon: the node IP and what to restore at stop (here: the host's sysctls and which of
        the fixed host paths exist)."""
        self.ip = node_ip()
        self.sysctls_before = {name: _read_sysctl(name) for name in SYSCTLS}
        self.host_paths_before = {str(p): p.exists() for p in HOST_PATHS}

    def _after_registered(self, deadline: float) -> None:
        """Once the kubelet registered the Node: start further node agents (none here)."""

    def _enter(self) -> list[str]:
        """The command prefix of every daemon (none: the host's namespaces)."""
        return []

    def _kubelet_argv(self) -> list[str]:
        return [
            str(self.binaries.kubelet),
            f"--config={self.work / 'node' / 'kubelet-config.json'}",
            f"--kubeconfig={self.work / 'node' / 'kubelet.kubeconfig'}",
            f"--root-dir={self.work / 'kubelet-root'}",
            f"--cert-dir={self.work / 'kubelet-root' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            "--v=1",
        ]

    def kill_kubelet(self) -> None:
        """SIGKILL the kubelet, as a crash of the node agent: the containers keep running under containerd and
        the Node goes NotReady after the control plane's grace period. :meth:`start_kubelet` brings it back."""
        popen = self.popens["kubelet"]
        popen.kill()
        popen.wait(timeout=30)

    def start_kubelet(self, timeout: float = 300.0) -> None:
        """Start the kubelet again (after :meth:`kill_kubelet`) and wait until the Node is Ready.

        Raises:
            RealNodeError: the kubelet failed or the Node did not become Ready within ``timeout`` s.
        """
        if self.popens["kubelet"].poll() is None:
            raise RealNodeError("start_kubelet: the kubelet is running")
        self._spawn("kubelet", self._kubelet_argv(), self.kubelet_log)
        self._save_state()
        self._wait(lambda: any(c.type == "Ready" and c.status == "True" for c in (
            self._core_cached().read_node(self.name).status.conditions or [])), f"Node {self.name} Ready again",
            time.monotonic() + timeout, self.kubelet_log)

    def import_image(self, archive: Path) -> None:
        """Import a docker-archive into containerd's ``k8s.io`` namespace (Pods use ``imagePullPolicy: Never``).

        Raises:
            RealNodeError: ``ctr images import`` failed.
        """
        proc = self._ctr(["images", "import", str(archive)], check=False, timeout=600)
        if proc.returncode != 0:
            raise RealNodeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")

    def stop(self) -> None:
        """Tear everything down (see the module docstring) and release the lock. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            teardown(self.work, self._state())
        finally:
            for p in self.popens.values():
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def rss_kib(self) -> dict[str, int]:
        """Resident set size (KiB) of kubelet and containerd now (``VmRSS`` from /proc)."""
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1])
        return out

    # ------------------------------------------------------------------ internals

    def _core(self) -> Any:
        from kubernetes import client, config

        api = config.new_client_from_config(
            config_file=load_state(self.cluster_state_dir)["kubeconfigs"]["admin"]
        )
        return client.CoreV1Api(api)

    def _ready(self) -> bool:
        n = self._core_cached().read_node(self.name)
        ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        own = {t["key"] for t in self.taints}
        return ready and not [t for t in (n.spec.taints or []) if t.key not in own]

    def _core_cached(self) -> Any:
        if not hasattr(self, "_core_api"):
            self._core_api = self._core()
        return self._core_api

    def restart_kubelet(self, between: Any = None, timeout: float = 180.0) -> None:
        """Stop the kubelet (SIGTERM, as a service manager would), call ``between()`` if given (e.g. delete the
        Node object), start it again with the same arguments, and wait until it has registered once more
        ("Successfully registered node" in its log) and the Node is Ready without lifecycle taints.

        Raises:
            RealNodeError: the kubelet exited or did not register/become Ready within ``timeout`` s.
        """
        marker = "Successfully registered node"
        registered = self.kubelet_log.read_text(errors="replace").count(marker)
        old = self.popens.pop("kubelet")
        old.send_signal(signal.SIGTERM)
        old.wait(timeout=60)
        if between is not None:
            between()
        self._spawn("kubelet", self.argvs["kubelet"], self.kubelet_log)
        self._save_state()
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.kubelet_log.read_text(errors="replace").count(marker) > registered,
                   f"kubelet of {self.name} registered again", deadline, self.kubelet_log)
        self._wait(self._ready, f"Node {self.name} Ready without taints", deadline, self.kubelet_log)

    def kill_container(self, container_id: str, sig: str = "SIGKILL") -> None:
        """Send ``sig`` to a container's main process through containerd (``ctr task kill``), as a crash would;
        ``container_id`` as in a Pod's ``containerStatuses[].containerID`` (``containerd://`` prefix optional).

        Raises:
            subprocess.CalledProcessError: ``ctr`` failed (no such task).
        """
        self._ctr(["task", "kill", "--signal", sig, container_id.removeprefix("containerd://")])

    def _ctr(self, args: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.sock), "-n", "k8s.io", *args], capture_output=True,
                              text=True, timeout=timeout, check=check)

    def _spawn(self, name: str, argv: list[str], log: Path) -> None:
        self.argvs[name] = argv
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*self._enter(), *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.work,
                start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self.popens[name] = popen
        self.pids[name] = popen.pid

    def _wait(self, check: Any, what: str, deadline: float, log: Path) -> None:
        last: Exception | None = None
        while True:
            for name, p in self.popens.items():
                if p.poll() is not None:
                    raise RealNodeError(f"{name} exited ({p.returncode}) while waiting for {what}; "
                                        f"last log lines:\n{tail(self.work / 'logs' / f'{name}.log', 30)}")
            try:
                if check():
                    return
            except Exception as exc:
                last = exc
            if time.monotonic() > deadline:
                raise RealNodeError(f"timed out waiting for {what} (last error: {last}); {log}:\n{tail(log, 30)}")
            time.sleep(0.1)

    def _write_containerd_config(self) -> None:
        c = self.work / "containerd"
        toml = f"""version = 2
root = "{c / 'root'}"
state = "{c / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images['pause']}"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.work / 'cni' / 'net.d'}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        (c / "config.toml").write_text(toml)

    def _write_cni(self) -> None:
        (self.work / "cni" / "net.d" / "10-zjusct.conflist").write_text(json.dumps(self._cni_conf(), indent=2) + "\n")

    def _cni_conf(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "zjusct-test",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.work / "cni" / "ipam"),
                         "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                         # the Service range via the bridge: in-cluster clients reach 10.96.0.1 (the kubernetes
                         # Service) through a DNAT the test installs (no kube-proxy here)
                         "routes": [{"dst": "10.96.0.0/16"}]},
            }],
        }

    def _write_kubelet_config(self) -> None:
        state = load_state(self.cluster_state_dir)
        pki = PKI.load(self.cluster_state_dir / "pki")
        node_dir = self.work / "node"
        pki.dir = node_dir  # the node's keys go to its own dir, not the cluster's PKI
        client_pair = pki.issue("kubelet-client", f"system:node:{self.name}", ("system:nodes",), client=True)
        serving = pki.issue("kubelet-serving", f"system:node:{self.name}", ("system:nodes",),
                            server=True, dns=(self.name,), ips=(self.ip,))
        write_kubeconfig(node_dir / "kubelet.kubeconfig", state["server"], pki.ca, client_pair,
                         f"system:node:{self.name}")
        port, healthz = self._kubelet_ports()
        cfg: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "address": self.ip,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.work / "pod-logs"),
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "resolvConf": "/etc/resolv.conf",
            "maxPods": 20,
            "allowedUnsafeSysctls": ["net.ipv4.ip_forward"],
            "nodeStatusReportFrequency": "10s",
            # the kubelet renews its Lease every quarter of this (3 s): the control plane's 16-s grace period then
            # spans about five renewals, so a kubelet stalled a few seconds on a loaded machine is not taken for a
            # lost node (with the default 40 s, one renewal every 10 s: one late renewal marked a busy node
            # Unknown in a CI run, and its VM Unknown/NodeLost, while the guest booted)
            "nodeLeaseDurationSeconds": 12,
            "registerWithTaints": list(self.taints),
            **self._kubelet_overrides(),
        }
        (node_dir / "kubelet-config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        self.timings["kubelet_port"] = port

    def _kubelet_ports(self) -> tuple[int, int]:
        """kubelet's serving and healthz ports (free ones: the host's namespace is shared)."""
        port, healthz = free_ports(2)
        return port, healthz

    def _kubelet_overrides(self) -> dict[str, Any]:
        """Fields merged into the KubeletConfiguration (none here)."""
        return {}

    def _extra_state(self) -> dict[str, Any]:
        """Further keys of the saved state that :func:`teardown` needs (none here)."""
        return {}

    def _state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "work": str(self.work),
            "cluster_state_dir": str(self.cluster_state_dir),
            "ip": self.ip,
            "pids": self.pids,
            "sysctls_before": self.sysctls_before,
            "host_paths_before": self.host_paths_before,
            "timings": self.timings,
            "supervisor": os.getpid(),
            "argvs": self.argvs,
            **self._extra_state(),
        }

    def _save_state(self) -> None:
        tmp = self.work / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self._state(), indent=2) + "\n")
        tmp.replace(self.work / STATE_FILE)


def teardown(work: Path, state: dict[str, Any]) -> list[str]:
    """Undo everything a real node did, from its saved state (works after a crash of the owner).

    Returns:
        Names of daemons that needed SIGKILL.
    """
    work = work.resolve()
    pids = {k: int(v) for k, v in state.get("pids", {}).items()}
    sock = work / "containerd" / "containerd.sock"
    # node agents besides kubelet and containerd (kube-proxy, kube-router of a NamespacedNode) first
    killed = kill_pids({k: v for k, v in pids.items() if k not in ("kubelet", "containerd")}, str(work), timeout=15)
    killed += kill_pids({k: v for k, v in pids.items() if k == "kubelet"}, str(work), timeout=15)
    if "containerd" in pids and pid_is_ours(pids["containerd"], str(work)):
        ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            tasks = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=20).stdout
            for task in tasks.split():
                subprocess.run([*ctr, "tasks", "kill", "-a", "-s", "SIGKILL", task], capture_output=True, timeout=20)
            for task in tasks.split():
                subprocess.run([*ctr, "tasks", "delete", "-f", task], capture_output=True, timeout=20)
            containers = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True,
                                        timeout=20).stdout
            for c in containers.split():
                subprocess.run([*ctr, "containers", "rm", c], capture_output=True, timeout=20)
    killed += kill_pids({k: v for k, v in pids.items() if k == "containerd"}, str(work), timeout=15)
    # shims outlive containerd by design; ours name our socket on their command line
    shims = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and pid_is_ours(int(proc.name), f"-address {sock}"):
            shims[f"shim-{proc.name}"] = int(proc.name)
    killed += kill_pids(shims, f"-address {sock}", timeout=5)
    for mnt in _mounts_under(work):
        subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
    if state.get("netns"):  # a NamespacedNode: its namespaces, routes and cgroups; nothing else of the host
        hostnet.teardown_node(hostnet.NodeAddressing(state["name"], int(state["index"])))
    elif pids:  # machine-wide leftovers exist only once a daemon ran (and then this node holds the machine lock)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
        for path_s, existed in state.get("host_paths_before", {}).items():
            if not existed:
                for mnt in _mounts_under(Path(path_s)):
                    subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
                shutil.rmtree(path_s, ignore_errors=True)
        _remove_kubepods_cgroups()
        _delete_node_object(state)
    for name, value in state.get("sysctls_before", {}).items():
        with contextlib.suppress(OSError):
            if _read_sysctl(name) != value:
                _write_sysctl(name, value)
    shutil.rmtree(work, ignore_errors=True)
    return killed


def _delete_node_object(state: dict[str, Any]) -> None:
    """Delete the Node object (kubelet is stopped: it would stay NotReady in the shared control plane)."""
    if not state.get("name") or not state.get("cluster_state_dir"):
        return
    with contextlib.suppress(Exception):
        from kubernetes import client, config

        kubeconfig = load_state(Path(state["cluster_state_dir"]))["kubeconfigs"]["admin"]
        api = config.new_client_from_config(config_file=kubeconfig)
        try:
            client.CoreV1Api(api).delete_node(state["name"])
        finally:
            api.close()


def _remove_kubepods_cgroups() -> None:
    for top in CGROUP_ROOT.glob("*/kubepods"):
        dirs = [top, *top.rglob("*")]
        for d in sorted((d for d in dirs if d.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
    for top in CGROUP_ROOT.glob("*/kubepods.slice"):
        with contextlib.suppress(OSError):
            top.rmdir()


def find_state(cluster_state_dir: Path) -> Path | None:
    """The work dir of the real node recorded for ``cluster_state_dir`` by ``node-up`` (None if none)."""
    pointer = cluster_state_dir / "real-node.work"
    if pointer.is_file():
        return Path(pointer.read_text().strip())
    return None


def stop_saved(work: Path) -> list[str]:
    """Stop a detached real node (``node-up``) from its state file: signal its supervisor, then tear down.

    Returns:
        Names of processes that needed SIGKILL.

    Raises:
        FileNotFoundError: no real-node state in ``work``.
    """
    state = json.loads((work / STATE_FILE).read_text())
    sup = int(state.get("supervisor", 0))
    if sup and sup != os.getpid() and pid_is_ours(sup, "_node-serve"):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
    if not work.exists():
        return []
    return teardown(work, state)
