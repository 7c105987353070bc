"""Benchmark of the CloudVM controller's own work: N CloudVMs from creation to their launcher Pod bound to a Node.

    /var/cache/zjusct-cloud/venv/bin/python bench/controller_scale.py [--vms 1000] [--nodes 4] [--json]

A control plane of its own (tests/cluster) with registered Node objects but **no kubelets** (the Pods are only
scheduled, never run): this measures the controller and the scheduler, not QEMU. Each CloudVM gets a root volume
claim bound to a hostPath PV (never mounted). The controller (``python -m zjusct_controller``, admin kubeconfig,
all namespaces) runs as a subprocess; the CloudVMs are created as fast as one client can, all in one namespace.

Figures:

* latency per VM: the CloudVM's create call returning -> a watch of Pods showing its launcher Pod with
  ``spec.nodeName`` (P50, P95, max; goal P95 <= 10 s);
* API requests per VM: the controller's ``zjusct_controller_api_requests_total`` (all methods; kopf's watch streams
  not counted) / N once every Pod is bound and the status writes settled (goal <= 5, KubeVirt's perf-scale count);
* controller RSS (MiB) at the end; the 1-minute load average at the end;
* CPU seconds (user + system) of the controller, of each control-plane process and of the bench's own client from
  the first create until every Pod is bound: where the machine's two cores went.

``--profile FILE`` samples the controller with py-spy (requirements-test.txt) from the first create until every
Pod is bound and writes the collapsed stacks (``py-spy record --format raw``, all threads, idle frames left out)
to FILE; ``bench/pyspy_top.py FILE`` sums them per function.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster, NodeSpec, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / ".collections"))
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from benchlib import percentile, rss_mib, stop_process  # bench/benchlib.py

REPO = Path(__file__).resolve().parent.parent
NS = "bench"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchBenchBenchBenchBenchBenchBenchBenchBen bench"


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of the controller's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {smp.name + json.dumps(smp.labels, sort_keys=True): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def run(vms: int, nodes: int, profile: Optional[Path] = None, controller_src: Path = REPO / "controller",
        ) -> dict[str, Any]:
    """Create ``vms`` CloudVMs against a fresh control plane with ``nodes`` Node objects; return the figures.
    ``controller_src``: the directory holding the ``zjusct_controller`` package to run (another commit's, for a
    before/after comparison under the same load)."""
    per_node = -(-vms // nodes) + 10
    specs = [NodeSpec(name=f"bench-{i}", address=f"127.0.20.{i + 1}", cpu=str(per_node), memory=f"{per_node}Gi",
                      pods=str(per_node)) for i in range(nodes)]
    work = Path(tempfile.mkdtemp(prefix="zjusct-bench-ctl-"))
    with Cluster(nodes=specs) as cluster:
        api = cluster.api_client()
        core: Any = client.CoreV1Api(api)
        custom: Any = client.CustomObjectsApi(api)
        ext: Any = client.ApiextensionsV1Api(api)
        (crd,) = [d for d in yaml.safe_load_all((REPO / "config/crd/cloudvms.cloud.zjusct.io.yaml").read_text()) if d]
        ext.create_custom_resource_definition(crd)
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
                 60, "CRD Established")
        core.create_namespace({"metadata": {"name": NS}})
        def volume(i: int) -> None:
            core.create_persistent_volume({"metadata": {"name": f"bench-vm{i}-root"}, "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                "hostPath": {"path": str(work)}, "claimRef": {"namespace": NS, "name": f"vm{i}-root"}}})
            core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": f"vm{i}-root"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"bench-vm{i}-root",
                "resources": {"requests": {"storage": "1Gi"}}}})

        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # set-up only, not measured
            list(pool.map(volume, range(vms)))
        wait_for(lambda: sum(1 for c in core.list_namespaced_persistent_volume_claim(NS).items
                             if c.status.phase == "Bound") == vms, 600, "claims Bound", interval=2)
        cfg = work / "controller.json"
        cfg.write_text(json.dumps({"launcherImage": "bench/launcher:none", "imageDir": "/nonexistent",
                                   "cmdline": "console=ttyS0"}))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(controller_src), str(REPO / ".collections")]))
        log = open(os.environ.get("BENCH_CTL_LOG", work / "controller.log"), "wb")
        ctl = subprocess.Popen([sys.executable, "-m", "zjusct_controller", "--config", str(cfg), "--kubeconfig",
                                str(cluster.kubeconfig), "--metrics-port", str(port), "--resync", "600"],
                               env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: scrape(port), 60, "controller metrics")
            created: dict[str, float] = {}
            bound: dict[str, float] = {}
            done = threading.Event()

            def watch_pods() -> None:
                w = watch.Watch()
                while not done.is_set():
                    try:
                        for ev in w.stream(core.list_namespaced_pod, NS, timeout_seconds=60):
                            pod = ev["object"]
                            vm = (pod.metadata.labels or {}).get("cloud.zjusct.io/vm")
                            if vm and pod.spec.node_name and vm not in bound:
                                bound[vm] = time.monotonic()
                            if len(bound) == vms:
                                done.set()
                                break
                    except Exception:
                        continue

            threading.Thread(target=watch_pods, daemon=True).start()
            spy = None
            if profile is not None:
                spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(ctl.pid),
                                        "--format", "raw", "--output", str(profile), "--threads", "--rate", "50",
                                        "--nonblocking"], stdout=subprocess.DEVNULL,
                                       stderr=open(f"{profile}.log", "wb"))
            watched = {"controller": ctl.pid, **{n: p.pid for n, p in cluster.processes.items()}}
            cpu0 = {n: cpu_s(pid) for n, pid in watched.items()}
            bench_cpu0 = sum(os.times()[:2])
            t0 = time.monotonic()
            for i in range(vms):
                body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": f"vm{i}"},
                        "spec": {"owner": "alice", "rootVolumeClaim": f"vm{i}-root", "powerState": "Running",
                                 "bootID": 1, "sshAuthorizedKeys": [KEY]}}
                custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
                created[f"vm{i}"] = time.monotonic()
            create_s = time.monotonic() - t0
            if not done.wait(timeout=max(600.0, vms * 2.0)):
                raise TimeoutError(f"only {len(bound)} of {vms} launcher Pods bound")
            all_bound_s = time.monotonic() - t0
            cpu = {n: round(cpu_s(pid) - cpu0[n], 1) for n, pid in watched.items()}
            cpu["bench"] = round(sum(os.times()[:2]) - bench_cpu0, 1)
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                spy.wait(timeout=60)

            def settled() -> bool:  # every status written: Pending with the Pod named
                items = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
                return sum(1 for o in items if (o.get("status") or {}).get("pod")) == vms

            wait_for(settled, 600, "statuses written", interval=2)
            def total() -> float:
                return sum(v for k, v in scrape(port).items() if k.startswith("zjusct_controller_api_requests_total"))

            last, t_settle = total(), time.monotonic()
            while True:  # until the controller is idle: no request for 5 s (bounded)
                time.sleep(5)
                now_total = total()
                if now_total == last or time.monotonic() - t_settle > 600:
                    break
                last = now_total
            idle_s = time.monotonic() - t0
            requests = now_total
            after = scrape(port)
            by_method = {json.loads(k[len("zjusct_controller_api_requests_total"):])["method"]: v
                         for k, v in after.items() if k.startswith("zjusct_controller_api_requests_total")}
            latencies = [bound[v] - created[v] for v in created]
            return {
                "vms": vms, "nodes": nodes,
                "create_calls_s": round(create_s, 1), "all_bound_s": round(all_bound_s, 1),
                "latency_s": {"p50": round(percentile(latencies, 50), 2), "p95": round(percentile(latencies, 95), 2),
                              "max": round(max(latencies), 2), "mean": round(statistics.mean(latencies), 2)},
                "api_requests_per_vm": round(requests / vms, 1),
                "api_requests_by_method": by_method,
                "idle_after_s": round(idle_s, 1),
                "controller_rss_mib": round(rss_mib(ctl.pid), 1),
                "load_avg_1m": round(os.getloadavg()[0], 1),
                "cpu_s_until_bound": cpu,
            }
        finally:
            stop_process(ctl)
            log.close()
            with contextlib.suppress(ApiException):
                core.delete_namespace(NS)
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vms", type=int, default=1000, help="CloudVMs to create (default 1000)")
    parser.add_argument("--nodes", type=int, default=4, help="Node objects to register (default 4)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--profile", type=Path, help="write py-spy collapsed stacks of the controller to this file")
    parser.add_argument("--controller-src", type=Path, default=REPO / "controller",
                        help="directory of the zjusct_controller package to run (default: this checkout's), e.g."
                             " `git archive COMMIT controller | tar -x -C DIR` and DIR/controller")
    args = parser.parse_args()
    result = run(args.vms, args.nodes, args.profile, args.controller_src.resolve())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    lat = result["latency_s"]
    print(f"{result['vms']} CloudVMs on {result['nodes']} Node objects (no kubelets)")
    print(f"create calls {result['create_calls_s']} s; all launcher Pods bound after {result['all_bound_s']} s")
    print(f"creation -> Pod bound: P50 {lat['p50']} s, P95 {lat['p95']} s (goal <= 10 s), max {lat['max']} s")
    print(f"API requests per VM: {result['api_requests_per_vm']} (goal <= 5) {result['api_requests_by_method']};"
          f" controller idle {result['idle_after_s']} s after the first create")
    print(f"controller RSS {result['controller_rss_mib']} MiB; load average (1 min) {result['load_avg_1m']}")
    print(f"CPU seconds from the first create until all bound: {result['cpu_s_until_bound']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
