#!/usr/bin/env python3
"""Start request -> guest SSH: the Kubernetes backend on the real node vs the host backend, same image, same run.

Both sides run the same playbook, ``playbooks/vm_start.yml`` (the ``zjusct.cloud.cloudvm`` task with
``power_state: running``, which waits until the VM is Running), on an existing stopped VM of 1 vCPU / 512 MiB
booting the same guest image set under QEMU/TCG, then ``playbooks/vm_stop.yml``:

A. Kubernetes (``ZJUSCT_CLOUD_BACKEND=kubernetes``): a control plane of its own (tests.cluster.Cluster), the real
   node (tests.cluster.RealNode: containerd + kubelet, one per machine, waits for the lock up to
   ``--lock-timeout`` s), the launcher image (``playbooks/launcher_image.yml``, cached) imported into it, the
   controller as a process with the rights of config/rbac/controller-role.yaml, and a hostPath filesystem root
   volume (a PV of a directory holding a copy of the image's ``rootfs.raw`` as ``root.raw``, pre-bound to the
   claim ``bench-root``). The controller writes Running only after the guest's SSH banner answered.
B. Host backend (bench/host_backend.py's host: SQLite store, launcher processes, a private netns and bridge):
   the VM ``bench`` with its root volume made from the same image set.

Each side boots once before the pairs (its first boot, not measured), then ``--pairs`` pairs alternate which side
runs first. Per start:

* ``task``: the cloudvm task's own start -> end (the ``ansible.posix.json`` callback's task duration): the start
  request to the module's return with phase Running;
* ``play``: the whole ``ansible-playbook vm_start.yml`` wall time (interpreter start, the owner checks, the
  look-up, the final message);
* ``banner``: from the task's start until a TCP connection from the host to the guest's SSH endpoint returns an
  ``SSH-`` banner (probed every ~0.2 s with a 0.5 s connect timeout from the moment the endpoint exists: on A the
  new launcher Pod's IP, which is what status.sshEndpoint then names - checked; on B the VM's lease address, inside
  the backend's netns). It is the guest's readiness as the host sees it, so ``task - banner`` is what each
  backend adds after the guest is up;
* A only: ``api``: the CloudVM's status Running (Ready condition ``lastTransitionTime``) minus the spec change
  (the ``managedFields`` time of the manager that wrote ``spec.bootID``); both 1-second resolution;
* B only: ``guest``: the launcher's spawn -> ready marker of that boot (bench/host_backend.py).

Prints each pair, the means and the same-run ratios mean(A) / mean(B) for ``task`` and ``banner``. There is no
numeric goal for this pair (the figure is reported as measured); exits non-zero only when a step fails.
``--host-only`` runs side B alone (no control plane, no real node): a dry run of the host half, no ratio.

Usage (root; from the repository root):
  /var/cache/zjusct-cloud/venv/bin/python bench/vm_start_backends.py [--pairs 2] [--lock-timeout 3600]
      [--json FILE] [--host-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".collections"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_backend import (  # noqa: E402  bench/
    host_cleanup,
    host_setup,
    key_args,
    last_guest_boot,
    playbook,
    start_task,
)
from kubernetes import client  # noqa: E402

from tests.cluster import Cluster, RealNode, wait_for  # noqa: E402
from tests.guest_image_fixture import GuestImage, ensure_image_set  # noqa: E402
from tests.integration.k8s_node.controller_helpers import (  # noqa: E402
    GROUP,
    VERSION,
    Controller,
    Vms,
    controller_kubeconfig,
    hostpath_root_volume,
    install_crd,
    teardown_vms,
)

VM = "bench"  # vm_start.yml's VM name: the owner's (-e owner=bench)
NS = "bench"
BOOT_TIMEOUT = 1500  # s, one TCG boot on a loaded 2-core machine (tests/integration/k8s_node)
PROBE = """
import socket, sys, time
host, port, deadline = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
while time.time() < deadline:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.settimeout(5)
            if s.recv(64).startswith(b"SSH-"):
                print(repr(time.time()), flush=True)
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(1)
"""


def epoch(value: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC time (``...Z``, with or without a fraction)."""
    return dt.datetime.fromisoformat(value.rstrip("Z")).replace(tzinfo=dt.UTC).timestamp()


class BannerProbe:
    """A thread that waits for ``endpoint()`` (host, port; None: not known yet) and then runs :data:`PROBE`
    (under ``ip netns exec netns`` when given); ``seen`` is the epoch time the first ``SSH-`` banner arrived."""

    def __init__(self, endpoint: Callable[[], tuple[str, int] | None], netns: str | None = None) -> None:
        self.endpoint, self.netns = endpoint, netns
        self.seen: float | None = None
        self.host: str | None = None
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        ep = None
        while ep is None and not self._stop.is_set():
            with contextlib.suppress(Exception):
                ep = self.endpoint()
            if ep is None:
                self._stop.wait(0.2)
        if ep is None:
            return
        self.host = ep[0]
        argv = [sys.executable, "-c", PROBE, ep[0], str(ep[1]), str(BOOT_TIMEOUT)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        out, _ = self._proc.communicate()
        if self._proc.returncode == 0 and out.strip():
            self.seen = float(out.strip())

    def result(self, timeout: float = 120) -> float | None:
        """Wait up to ``timeout`` s for the banner (the guest is Running when this is called), then stop."""
        self._t.join(timeout)
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        self._t.join(10)
        return self.seen


# --------------------------------------------------------------------------- B: host backend


class HostSide:
    """bench/host_backend.py's host with the VM ``bench`` (created and booted once by :meth:`setup`)."""

    def __init__(self, image: GuestImage) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="zjc-bench-start-"))
        self.config, self.env = host_setup(self.root, image=image.manifest["name"], subnet="10.216.0.0/24")
        self.endpoint: tuple[str, int] | None = None

    def setup(self) -> None:
        """First boot (creates the VM and its volume) and stop; the SSH endpoint (the lease) is kept."""
        _, doc = playbook("vm_start", self.env, [*key_args(self.root), "-e", f"wait_timeout={BOOT_TIMEOUT}"],
                          json_output=True)
        assert doc is not None
        ep = start_task(doc)[2]["cloudvm"]["status"]["sshEndpoint"]
        self.endpoint = (ep["host"], int(ep["port"]))
        playbook("vm_stop", self.env)

    def start(self) -> dict[str, float]:
        probe = BannerProbe(lambda: self.endpoint, self.config["netns"])
        play, doc = playbook("vm_start", self.env, [*key_args(self.root), "-e", f"wait_timeout={BOOT_TIMEOUT}"],
                             json_output=True)
        assert doc is not None
        t0, t1, res = start_task(doc)
        if (res.get("phase"), res.get("changed")) != ("Running", True):
            raise RuntimeError(f"host vm_start: {res}")
        banner = probe.result()
        guest = last_guest_boot(self.config)
        stop, _ = playbook("vm_stop", self.env)
        return {"task": t1 - t0, "play": play, "banner": (banner - t0) if banner else float("nan"),
                "guest": guest, "stop_play": stop}

    def cleanup(self) -> None:
        host_cleanup(self.root, self.config, self.env)


# --------------------------------------------------------------------------- A: Kubernetes on the real node


class KubeSide:
    """The CloudVM ``bench/bench`` on the real node, run by the real controller (see the module docstring)."""

    def __init__(self, cluster: Cluster, node: RealNode, image: GuestImage, launcher_tag: str, work: Path) -> None:
        self.cluster, self.node, self.image, self.work = cluster, node, image, work
        self.api = cluster.api_client()
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.launcher_tag = launcher_tag
        self.pv: str | None = None
        self.vms: Vms | None = None
        self.key = work / "key"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("K8S_AUTH_", "ZJUSCT_CLOUD_CONFIG"))}
        self.env.update(ZJUSCT_CLOUD_BACKEND="kubernetes", K8S_AUTH_KUBECONFIG=str(cluster.kubeconfig),
                        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        self.args = ["-e", f"vm_namespace={NS}", "-e", f"ssh_public_key_file={self.key}.pub",
                     "-e", f"wait_timeout={BOOT_TIMEOUT}"]

    def setup(self) -> None:
        """CRD, namespace, the hostPath root volume, the controller; the CloudVM created Running (boot 1, not
        measured), then stopped with vm_stop.yml."""
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        install_crd(self.api)
        self.core.create_namespace({"metadata": {"name": NS}})
        wait_for(lambda: self.core.read_namespaced_service_account("default", NS), 60, "default ServiceAccount")
        volume = self.work / "volume"
        volume.mkdir()
        subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(self.image.rootfs), str(volume / "root.raw")],
                       check=True, timeout=600)
        self.pv = hostpath_root_volume(self.core, NS, volume, claim=f"{VM}-root", size="4Gi")
        placement = self.node.pod_placement()
        cfg = self.work / "controller.json"
        cfg.write_text(json.dumps({"launcherImage": self.launcher_tag, "imageDir": str(self.image.dir),
                                   "cmdline": self.image.default_cmdline, "accel": "tcg",
                                   "nodeSelector": placement["nodeSelector"],
                                   "tolerations": placement["tolerations"]}))
        kubeconfig = controller_kubeconfig(self.api, self.cluster.kubeconfig, self.work / "controller.kubeconfig")
        ctl = Controller(kubeconfig, cfg, NS, self.work / "controller.log").start()
        self.vms = Vms(self.core, self.custom, NS, ctl)
        pubkey = (self.work / "key.pub").read_text().strip()
        self.vms.create({"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": VM},
                         "spec": {"owner": "bench", "rootVolumeClaim": f"{VM}-root", "vcpus": 1, "memoryMiB": 512,
                                  "powerState": "Running", "bootID": 1, "sshAuthorizedKeys": [pubkey]}})
        st = self.vms.status_when(VM, lambda s: s.get("bootID") == 1 and s.get("phase") in ("Running", "Failed"),
                                  BOOT_TIMEOUT, "first boot Running", interval=2)["status"]
        if st["phase"] != "Running":
            raise RuntimeError(f"first boot on the real node: {st}")
        playbook("vm_stop", self.env, self.args[:2])

    def _pod_ip(self, boot: int) -> tuple[str, int] | None:
        pod = self.core.read_namespaced_pod(f"{VM}-boot-{boot}", NS)
        return (pod.status.pod_ip, 22) if pod.status and pod.status.pod_ip else None

    def start(self) -> dict[str, float]:
        assert self.vms is not None
        boot = int(self.vms.vm(VM)["spec"]["bootID"]) + 1  # vm_start on a Stopped VM: one new boot
        probe = BannerProbe(lambda: self._pod_ip(boot))
        play, doc = playbook("vm_start", self.env, self.args, json_output=True)
        assert doc is not None
        t0, t1, res = start_task(doc)
        if (res.get("phase"), res.get("changed"), res.get("boot_id")) != ("Running", True, boot):
            raise RuntimeError(f"kubernetes vm_start: {res}")
        banner = probe.result()
        vm = self.vms.vm(VM)
        ep = vm["status"]["sshEndpoint"]
        if probe.host != ep["host"] or int(ep["port"]) != 22:
            raise RuntimeError(f"probed {probe.host}:22 but status.sshEndpoint is {ep}")
        ready = next(c for c in vm["status"]["conditions"] if c["type"] == "Ready")
        spec_at = max(epoch(m["time"]) for m in vm["metadata"]["managedFields"]
                      if not m.get("subresource") and "f:bootID" in json.dumps(m.get("fieldsV1", {})))
        stop, _ = playbook("vm_stop", self.env, self.args[:2])
        return {"task": t1 - t0, "play": play, "banner": (banner - t0) if banner else float("nan"),
                "api": epoch(ready["lastTransitionTime"]) - spec_at, "stop_play": stop}

    def cleanup(self) -> None:
        if self.vms is not None:
            teardown_vms(self.vms, [VM], [self.pv] if self.pv else [])
        elif self.pv:
            with contextlib.suppress(Exception):
                self.core.delete_persistent_volume(self.pv)


def launcher_archive(work: Path) -> tuple[Path, str]:
    """``playbooks/launcher_image.yml`` without its own import (cached): ``(archive, tag)``."""
    report = work / "launcher-image.json"
    subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/launcher_image.yml",
                    "-e", '{"launcher_image_import": false}', "-e", f"launcher_image_report_file={report}"],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    info = json.loads(report.read_text())
    return Path(info["archive"]), str(info["tag"])


# --------------------------------------------------------------------------- report


def fmt(v: float | None) -> str:
    return "      -" if v is None else f"{v:7.1f}"


def report(pairs: list[dict[str, Any]], host_only: bool) -> dict[str, Any]:
    """Print each pair, the means and the ratios; return the summary."""
    print(f"{'pair':>4} {'first':>5} {'load1':>5} | {'A task':>7} {'A play':>7} {'A bnr':>7} {'A api':>7} | "
          f"{'B task':>7} {'B play':>7} {'B bnr':>7} {'B guest':>7}")
    for i, p in enumerate(pairs, 1):
        a, b = p.get("A", {}), p["B"]
        print(f"{i:>4} {p['first']:>5} {p['load1']:5.1f} | {fmt(a.get('task'))} {fmt(a.get('play'))} "
              f"{fmt(a.get('banner'))} {fmt(a.get('api'))} | {fmt(b['task'])} {fmt(b['play'])} {fmt(b['banner'])} "
              f"{fmt(b['guest'])}")
    summary: dict[str, Any] = {}
    for side in ("A", "B"):
        rows = [p[side] for p in pairs if side in p]
        if rows:
            summary[side] = {k: round(statistics.mean(r[k] for r in rows), 2) for k in rows[0]}
    for side, s in summary.items():
        print(f"mean {side}: " + ", ".join(f"{k} {v:.1f} s" for k, v in s.items()))
    if not host_only:
        a, b = summary["A"], summary["B"]
        summary["ratio_task"] = round(a["task"] / b["task"], 3)
        summary["ratio_banner"] = round(a["banner"] / b["banner"], 3)
        print(f"same-run ratio mean(A)/mean(B): task (start request -> Running returned) {summary['ratio_task']:.3f}"
              f"; banner (start request -> SSH banner seen from the host) {summary['ratio_banner']:.3f}")
        print(f"after the banner: A adds {a['task'] - a['banner']:.1f} s, B {b['task'] - b['banner']:.1f} s "
              "until the module returns")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2, help="measured pairs (A and B each start once), >= 1")
    ap.add_argument("--lock-timeout", type=float, default=3600,
                    help="seconds to wait for the real node's lock (another session's real node)")
    ap.add_argument("--host-only", action="store_true", help="run side B alone (a dry run; no ratio)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error(f"--pairs: {a.pairs} is below the minimum 1")
    if a.lock_timeout <= 0:
        ap.error(f"--lock-timeout: {a.lock_timeout} must be above 0 seconds")
    out: dict[str, Any] = {"load1_start": os.getloadavg()[0], "pairs": []}
    image, _ = ensure_image_set()
    out["image"] = image.manifest["name"]
    host = HostSide(image)
    try:
        host.setup()  # B's first boot, also while the real node may still be someone else's
        with contextlib.ExitStack() as stack:
            kube: KubeSide | None = None
            if not a.host_only:
                work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zjc-bench-start-k8s-")))
                archive, tag = launcher_archive(work)
                cluster = stack.enter_context(Cluster())
                t_node = time.monotonic()  # includes the wait for another session's real node (the lock)
                node = stack.enter_context(RealNode(cluster.state_dir, extra_images=(archive,),
                                                    lock_timeout=a.lock_timeout))
                out["node_start_s"] = round(time.monotonic() - t_node, 1)
                kube = KubeSide(cluster, node, image, tag, work)
                stack.callback(kube.cleanup)
                kube.setup()
            for i in range(a.pairs):
                first = "A" if i % 2 == 0 else "B"
                pair: dict[str, Any] = {"first": first if kube else "B", "load1": os.getloadavg()[0]}
                for side in ("AB" if first == "A" else "BA"):
                    if side == "A" and kube is not None:
                        pair["A"] = kube.start()
                    elif side == "B":
                        pair["B"] = host.start()
                print(json.dumps(pair), flush=True)
                out["pairs"].append(pair)
    finally:
        host.cleanup()
    out["load1_end"] = os.getloadavg()[0]
    out["summary"] = report(out["pairs"], a.host_only)
    print(f"load average (1 min): {out['load1_start']:.1f} at the start, {out['load1_end']:.1f} at the end")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
