"""Benchmark of the zjusct.cloud.cloudvm inventory on a large fleet (case A1).

    /var/cache/zjusct-cloud/venv/bin/python bench/inventory_scale.py [--vms 10000] [--runs 3]
        [--kubeconfig PATH] [--threads 16] [--json]

* Starts the test control plane (tests/cluster) unless ``--kubeconfig`` names a running one
  (``eval "$(python -m tests.cluster up)"`` keeps one up between runs), installs the CloudVM CRD
  and creates ``--vms`` CloudVMs in namespace ``bench-inventory`` (threads over keep-alive HTTPS;
  each is created, then reported Running through the status subresource as the controller would).
  An existing namespace with enough Running VMs is reused.
* Measures, in the same run and on the same objects, best and median of ``--runs``:
  - ``baseline``: a fresh Python process that imports the kubernetes client and lists every
    CloudVM with ``list_cluster_custom_object`` page by page (limit 500), like
    ``kubectl get cloudvms -A -o json`` end to end;
  - ``baseline_list_only``: the same paginated list inside this process (no start-up, no import);
  - ``floor``: ``ansible-inventory --list`` of an empty inventory (Ansible's own start-up);
  - ``inventory``: ``ansible-inventory -i bench.cloudvm.yml --list`` end to end, no cache;
  - ``inventory_cached``: the same with the jsonfile cache warm;
  - ``playbook_inventory``: ``ansible -i bench.cloudvm.yml all --list-hosts`` (what ansible-playbook pays for
    the inventory: no per-host variable resolution, no JSON output), with the plugin's own split into
    listing and building the in-memory inventory (from its ``-vvv`` line).
* Prints each figure, the ratio inventory / baseline and the goals (at most 2 s, at most 2x the baseline).
  No assertion: the machine's load decides the absolute numbers, the ratio is the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".collections"))

import yaml  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils._spec import GROUP, PLURAL, VERSION  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _kube_list as kube  # noqa: E402

VENV_BIN = Path(os.environ.get("ZJUSCT_VENV", "/var/cache/zjusct-cloud/venv")) / "bin"
NAMESPACE = "bench-inventory"
BASELINE = r"""
import json, sys
from kubernetes import client, config
api = client.CustomObjectsApi(config.new_client_from_config(config_file=sys.argv[1]))
items, token = [], None
while True:
    page = api.list_cluster_custom_object("cloud.zjusct.io", "v1alpha1", "cloudvms", limit=500,
                                          _continue=token, _request_timeout=120)
    items.extend(page["items"])
    token = page["metadata"].get("continue")
    if not token:
        break
print(len(items))
"""


def request(conn: Any, method: str, path: str, body: dict, content_type: str) -> tuple[int, bytes]:
    conn.request(method, path, body=json.dumps(body), headers={"Content-Type": content_type,
                                                                 "Accept": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def populate(kubeconfig: str, count: int, threads: int) -> float:
    """Create ``count`` Running CloudVMs in NAMESPACE (skipping existing ones); returns seconds spent."""
    import http.client
    import urllib.parse

    conn_info = kube.resolve({"kubeconfig": kubeconfig}, env={})
    url = urllib.parse.urlsplit(conn_info.server)
    ctx = kube._ssl_context(conn_info)
    t0 = time.monotonic()
    errors: list[str] = []
    lock = threading.Lock()
    todo = list(range(count))

    def worker() -> None:
        conn = http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=60)
        while True:
            with lock:
                if not todo or len(errors) > 10:
                    return
                i = todo.pop()
            name = f"vm-{i:05d}"
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM",
                    "metadata": {"name": name, "labels": {"cloud.zjusct.io/course": f"c{i % 20}"}},
                    "spec": {"owner": f"user{i % 500}", "rootVolumeClaim": f"{name}-root", "vcpus": 1 + i % 4,
                             "memoryMiB": 512, "powerState": "Running", "bootID": 1}}
            base = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
            status, out = request(conn, "POST", base, body, "application/json")
            if status not in (201, 409):
                with lock:
                    errors.append(f"create {name}: {status} {out[:200]!r}")
                continue
            report = {"status": {"phase": "Running", "reason": "SSHReady", "bootID": 1, "node": f"node-{i % 2}",
                                 "sshEndpoint": {"host": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                                                 "port": 22}}}
            status, out = request(conn, "PATCH", f"{base}/{name}/status", report, "application/merge-patch+json")
            if status != 200:
                with lock:
                    errors.append(f"status {name}: {status} {out[:200]!r}")

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise SystemExit("populating failed: " + "; ".join(errors[:5]))
    return time.monotonic() - t0


def ensure_crd(kubeconfig: str) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api = config.new_client_from_config(config_file=kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    (crd,) = [d for d in yaml.safe_load_all((REPO / "config/crd/cloudvms.cloud.zjusct.io.yaml").read_text()) if d]
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + 120
    while True:
        try:
            objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
            break
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def running_count(kubeconfig: str) -> int:
    get_json = kube.http_get_json(kube.resolve({"kubeconfig": kubeconfig}, env={}), 120)
    items, _ = kube.list_objects(get_json, [NAMESPACE])
    return sum(1 for o in items if (o.get("status") or {}).get("phase") == "Running")


SPLIT = re.compile(r"listing ([0-9.]+) s, building the inventory ([0-9.]+) s")


def timed(argv: list[str], env: dict, split: dict[str, list[float]] | None = None) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr[-2000:]}")
    if split is not None:
        m = SPLIT.search(proc.stdout + proc.stderr)
        if m:
            split["plugin_listing"].append(float(m.group(1)))
            split["plugin_building"].append(float(m.group(2)))
    return elapsed


def measure(kubeconfig: str, count: int, runs: int) -> dict[str, Any]:
    from kubernetes import client, config

    work = Path(tempfile.mkdtemp(prefix="zjusct-inv-bench-"))
    try:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
                   PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
        src = work / "bench.cloudvm.yml"
        src.write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "kubeconfig": kubeconfig}))
        cached = work / "cached.cloudvm.yml"
        cached.write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "kubeconfig": kubeconfig, "cache": True,
                                          "cache_plugin": "ansible.builtin.jsonfile",
                                          "cache_connection": str(work / "cache"), "cache_timeout": 3600}))
        empty = work / "empty.ini"
        empty.write_text("")
        script = work / "baseline.py"
        script.write_text(BASELINE)
        inventory_cmd = [str(VENV_BIN / "ansible-inventory"), "-i", str(src), "--list"]
        # check once that the inventory really has every VM
        proc = subprocess.run(inventory_cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                              check=True)
        hosts = len(json.loads(proc.stdout)["_meta"]["hostvars"])
        subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(cached), "--list"], cwd=REPO, env=env,
                       capture_output=True, timeout=900, check=True)  # warm the cache
        api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))

        def list_only() -> float:
            t0 = time.monotonic()
            token, n = None, 0
            while True:
                page = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=500, _continue=token,
                                                      _request_timeout=120)
                n += len(page["items"])
                token = page["metadata"].get("continue")
                if not token:
                    break
            return time.monotonic() - t0

        figures: dict[str, list[float]] = {k: [] for k in (
            "baseline", "baseline_list_only", "floor", "inventory", "inventory_cached", "playbook_inventory",
            "plugin_listing", "plugin_building")}
        for _ in range(runs):  # interleaved, so load changes hit every figure alike
            figures["baseline"].append(timed([str(VENV_BIN / "python"), str(script), kubeconfig], env))
            figures["baseline_list_only"].append(list_only())
            figures["floor"].append(timed([str(VENV_BIN / "ansible-inventory"), "-i", str(empty), "--list"], env))
            figures["inventory"].append(timed(inventory_cmd, env))
            figures["inventory_cached"].append(timed([str(VENV_BIN / "ansible-inventory"), "-i", str(cached),
                                                      "--list"], env))
            figures["playbook_inventory"].append(timed([str(VENV_BIN / "ansible"), "-i", str(src), "all",
                                                        "--list-hosts", "-vvv"], env, split=figures))
        return {"hosts": hosts, "figures": figures}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--kubeconfig", help="admin kubeconfig of a running cluster (default: start one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cluster = None
    if args.kubeconfig:
        kubeconfig = args.kubeconfig
    else:
        from tests.cluster import Cluster

        cluster = Cluster()
        cluster.start()
        kubeconfig = str(cluster.kubeconfig)
    try:
        ensure_crd(kubeconfig)
        have = running_count(kubeconfig)
        populate_s = 0.0
        if have < args.vms:
            populate_s = populate(kubeconfig, args.vms, args.threads)
        result = measure(kubeconfig, args.vms, args.runs)
    finally:
        if cluster is not None:
            cluster.stop()
    figures = result["figures"]
    best = {k: min(v) for k, v in figures.items()}
    median = {k: statistics.median(v) for k, v in figures.items()}
    load = os.getloadavg()
    report = {"vms": args.vms, "hosts_listed": result["hosts"], "populate_s": round(populate_s, 1),
              "best_s": best, "median_s": median, "runs": args.runs, "cpus": os.cpu_count(),
              "loadavg_1m": load[0],
              "ratio_inventory_to_baseline": best["inventory"] / best["baseline"],
              "ratio_inventory_to_list_only": best["inventory"] / best["baseline_list_only"],
              "ratio_cached_to_baseline": best["inventory_cached"] / best["baseline"],
              "ratio_plugin_listing_to_list_only": best["plugin_listing"] / best["baseline_list_only"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"CloudVMs: {args.vms} (Running, listed by the inventory: {result['hosts']}); populate {populate_s:.1f} s; "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f}")
    print(f"{'figure':<22}{'best s':>9}{'median s':>10}")
    for key in figures:
        print(f"{key:<22}{best[key]:>9.2f}{median[key]:>10.2f}")
    print(f"ratio inventory / baseline (end to end)      {report['ratio_inventory_to_baseline']:.2f}x  (goal <= 2x)")
    print(f"ratio inventory / list only (in process)     {report['ratio_inventory_to_list_only']:.2f}x")
    print(f"ratio cached inventory / baseline            {report['ratio_cached_to_baseline']:.2f}x")
    print(f"ratio plugin's listing / list only           {report['ratio_plugin_listing_to_list_only']:.2f}x")
    print(f"inventory end to end {best['inventory']:.2f} s (goal <= 2 s); Ansible's own start-up (floor) "
          f"{best['floor']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
