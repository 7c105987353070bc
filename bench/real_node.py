#!/usr/bin/env python3
"""The real test node (containerd + kubelet, tests.cluster.RealNode): start-up, Pod latency, launcher Pod vs host.

Measures, in one run on one machine:
  1. kubelet start -> Node Ready without taints (also containerd start -> serving, image build/import);
  2. Pod create -> phase Running for ``--pods`` busybox Pods created one after another (API watch);
  3. kubelet and containerd RSS (VmRSS) with those Pods running;
  4. with ``--launcher`` (needs the guest image set and builds/reuses the launcher image): ``--pairs`` alternating
     pairs of A. launcher Pod create -> ready marker (the launcher saw the guest's SSH banner) and -> SSH banner
     seen from the host at the Pod IP, and B. the same launcher config run directly on the host in a netns with the
     same bridge/TAP setup: process start -> ready marker. Ratio mean(A) / mean(B), goal <= 1.10.

Usage (root; from the repository root):
  /var/cache/zjusct-cloud/venv/bin/python bench/real_node.py [--pods 5] [--launcher] [--pairs 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client, watch  # noqa: E402

from tests.cluster import Cluster, RealNode  # noqa: E402
from tests.integration.k8s_node.launcher_pod import (  # noqa: E402
    NET_SETUP,
    config_map,
    launcher_config,
    launcher_pod,
)
from tests.integration.k8s_node.test_launcher_pod import ssh_banner  # noqa: E402

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))


def wait_running(core: Any, ns: str, name: str, timeout: float = 120) -> float:
    """Seconds until the Pod is Running (monotonic clock at the event), watched from before the create."""
    w = watch.Watch()
    try:
        for event in w.stream(core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}",
                              timeout_seconds=int(timeout)):
            if event["object"].status.phase == "Running":
                return time.monotonic()
    finally:
        w.stop()
    raise TimeoutError(f"{name} not Running after {timeout}s")


def pod_latency(core: Any, node: RealNode, ns: str, count: int) -> list[float]:
    out = []
    for i in range(count):
        name = f"lat-{i}"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {**node.pod_placement(), "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": str(node.images["busybox"]),
                                        "imagePullPolicy": "Never", "command": ["sleep", "600"]}]}}
        t0 = time.monotonic()
        core.create_namespaced_pod(ns, pod)
        out.append(wait_running(core, ns, name) - t0)
    return out


def wait_file(path: Path, timeout: float, alive: Any = None) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return time.monotonic()
        if alive is not None and not alive():
            raise RuntimeError(f"ended before {path} appeared")
        time.sleep(0.2)
    raise TimeoutError(f"{path} not there after {timeout}s")


def launcher_pair(core: Any, node: RealNode, ns: str, image: Any, tag: str, work: Path, i: int) -> dict[str, float]:
    key = work / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    pub = (work / "id_ed25519.pub").read_text().strip()
    res: dict[str, float] = {}
    # A. in a Pod
    vm = work / f"pod-{i}"
    vm.mkdir()
    subprocess.run(["cp", "--sparse=always", str(image["dir"] / "rootfs.raw"), str(vm / "root.raw")], check=True)
    cfg = launcher_config(f"bench{i}", image["dir"], image["cmdline"], pub)
    cfg["readyMarkerPath"] = "/vm/ready"
    core.create_namespaced_config_map(ns, config_map(f"bench{i}", cfg))
    t0 = time.monotonic()
    core.create_namespaced_pod(ns, launcher_pod(f"bench{i}", tag, node.pod_placement(), image["dir"], vm,
                                                f"bench{i}"))
    res["pod_running_s"] = wait_running(core, ns, f"bench{i}") - t0
    res["pod_ready_marker_s"] = wait_file(vm / "ready", 1800) - t0
    ip = core.read_namespaced_pod(f"bench{i}", ns).status.pod_ip
    while not ssh_banner(ip, timeout=2):
        time.sleep(0.2)
    res["pod_ssh_from_host_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    core.delete_namespaced_pod(f"bench{i}", ns)
    while True:
        try:
            core.read_namespaced_pod(f"bench{i}", ns)
        except client.ApiException:
            break
        time.sleep(0.5)
    res["pod_delete_to_gone_s"] = time.monotonic() - t1
    # B. the same config directly on the host, in a netns with the same bridge (no DNAT needed)
    vm = work / f"host-{i}"
    vm.mkdir()
    subprocess.run(["cp", "--sparse=always", str(image["dir"] / "rootfs.raw"), str(vm / "root.raw")], check=True)
    cfg = launcher_config(f"bench{i}", image["dir"], image["cmdline"], pub, in_pod=False, vm_dir=vm)
    cfg["readyMarkerPath"] = str(vm / "ready")
    (vm / "launcher.json").write_text(json.dumps(cfg))
    netns = f"zjbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        setup = NET_SETUP.split("nft -f")[0]  # bridge only: the host probe is the launcher's own
        subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", setup], check=True)
        env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"))
        t0 = time.monotonic()
        proc = subprocess.Popen(["ip", "netns", "exec", netns, "python3", "-m", "zjusct_launcher", "run",
                                 "--config", str(vm / "launcher.json")], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(vm / "launcher.log", "wb"))
        res["host_ready_marker_s"] = wait_file(vm / "ready", 1800, lambda: proc.poll() is None) - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=5)
    ap.add_argument("--launcher", action="store_true")
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    report: dict[str, Any] = {"load1_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="zjbench-node-") as tmp, Cluster() as cluster:
        work = Path(tmp)
        extra: tuple[Path, ...] = ()
        image: dict[str, Any] | None = None
        tag = ""
        if a.launcher:
            manifests = sorted(glob.glob(str(CACHE / "images" / "*" / "manifest.json")))
            if not manifests:
                raise SystemExit("no guest image set under $ZJUSCT_CACHE/images (run the guest_image playbook)")
            d = Path(manifests[-1]).parent
            image = {"dir": d, "cmdline": json.loads(Path(manifests[-1]).read_text())["defaultCmdline"]}
            rep = work / "li.json"
            subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/launcher_image.yml",
                            "-e", '{"launcher_image_import": false}', "-e", f"launcher_image_report_file={rep}"],
                           cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            li = json.loads(rep.read_text())
            extra, tag = (Path(li["archive"]),), li["tag"]
        node = RealNode(cluster.state_dir, extra_images=extra)
        with node:
            report["node"] = {k: round(v, 3) for k, v in node.timings.items()}
            core: Any = client.CoreV1Api(cluster.api_client())
            ns = "bench"
            core.create_namespace({"metadata": {"name": ns}})
            while True:
                try:
                    core.read_namespaced_service_account("default", ns)
                    break
                except client.ApiException:
                    time.sleep(0.2)
            lat = pod_latency(core, node, ns, a.pods)
            report["pod_create_to_running_s"] = [round(x, 3) for x in lat]
            report["rss_kib_with_pods"] = node.rss_kib()
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            if a.launcher and image is not None:
                pairs = [launcher_pair(core, node, ns, image, tag, work, i) for i in range(a.pairs)]
                report["launcher_pairs"] = pairs
                pod = statistics.mean(p["pod_ready_marker_s"] for p in pairs)
                host = statistics.mean(p["host_ready_marker_s"] for p in pairs)
                report["launcher_ratio_pod_over_host"] = round(pod / host, 3)
                report["rss_kib_after_launcher"] = node.rss_kib()
    report["load1_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
