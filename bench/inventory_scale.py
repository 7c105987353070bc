"""Benchmark of the zjusct.cloud.cloudvm inventory on a large fleet (case A1), both sources, both host variable layouts.

    /var/cache/zjusct-cloud/venv/bin/python bench/inventory_scale.py [--vms 10000] [--runs 3]
        [--kubeconfig PATH] [--threads 16] [--host-vms N] [--skip-kubernetes] [--skip-host] [--json]

Kubernetes source (skipped with ``--skip-kubernetes``):

* Starts the test control plane (tests/cluster) unless ``--kubeconfig`` names a running one
  (``eval "$(python -m tests.cluster up)"`` keeps one up between runs), installs the CloudVM CRD
  and creates ``--vms`` CloudVMs in namespace ``bench-inventory`` (threads over keep-alive HTTPS;
  each is created, then reported Running through the status subresource as the controller would).
  An existing namespace with enough Running VMs is reused.
* Measures, in the same run and on the same objects, ``--runs`` rounds of:
  - ``kubectl``: ``kubectl get cloudvms -A -o json`` end to end (the peer; kubectl of the control
    plane's Kubernetes version, built by ``K8S_EXTRA_BINS=kubectl hack/build-k8s.sh`` into the same cache when
    missing; it lists in chunks of 500 as the plugin does);
  - ``baseline``: a fresh Python process that imports the kubernetes client and lists every
    CloudVM with ``list_cluster_custom_object`` page by page (limit 500);
  - ``baseline_list_only``: the same paginated list inside this process (no start-up, no import);
  - ``floor``: ``ansible-inventory --list`` of an empty inventory (Ansible's own start-up);
  - ``inventory_flat`` / ``inventory_nested``: ``ansible-inventory -i bench.cloudvm.yml --list`` end to
    end, no cache, with ``hostvars_layout: flat`` (today's, the default) and ``nested`` (one ``cloudvm``
    dict); the two run back to back and the one that runs first alternates per round;
  - ``inventory_export``: the flat layout with ``--list --export`` (host variables as the inventory set
    them, without Ansible's per-host variable resolution; the same JSON for this inventory);
  - ``inventory_cached``: the flat layout with the jsonfile cache warm;
  - ``list_hosts_flat`` / ``list_hosts_nested``: ``ansible -i … all --list-hosts -vvv`` (what ansible-playbook
    pays for the inventory: no per-host variable resolution, no JSON output), alternating like the pair
    above, with the plugin's own split into listing and building the in-memory inventory (its ``-vvv`` line).

Host source (skipped with ``--skip-host``):

* Writes a host store (SQLite, ``HostStore`` as the host backend does) with ``--host-vms`` (default
  ``--vms``) Running VMs in a temporary directory, each with the launcher files of boot 1, and starts
  one stand-in launcher process that holds every VM's launcher lock (``boot-1.json`` on its command
  line), so the listing derives Running for each from what runs, as for real launchers.
* Measures ``--runs`` rounds of ``host_baseline`` (a fresh Python process listing the store with
  ``observed_vms``, the read path of cloudvm_info and of the host source) and ``host_flat`` /
  ``host_nested`` (``ansible-inventory --list`` with ``source: host``, alternating which runs first).

Every figure is wall seconds and the child's CPU seconds (user + system, ``RUSAGE_CHILDREN``); the CPU
figure depends less on what else the machine runs. Prints best and median, same-run ratios (each side
against its baseline; nested against flat per round) and the load average before and after. No assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _kube_list as kube  # noqa: E402
from benchlib import stop_process  # noqa: E402

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
LAYOUTS = ("flat", "nested")
Figures = dict[str, list[tuple[float, float]]]  # name -> [(wall s, CPU s)] per round


def timed(argv: list[str], env: dict, split: dict[str, list[float]] | None = None,
          split_key: str = "") -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one command; with ``split`` the plugin's -vvv listing and
    building seconds are appended under ``plugin_listing<split_key>`` / ``plugin_building<split_key>``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr[-2000:]}")
    if split is not None:
        m = SPLIT.search(proc.stdout + proc.stderr)
        if m:
            split.setdefault("plugin_listing" + split_key, []).append(float(m.group(1)))
            split.setdefault("plugin_building" + split_key, []).append(float(m.group(2)))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def kubectl_binary() -> str:
    """kubectl of the pinned Kubernetes version from the build cache, built there first when missing (seconds
    with the control plane's Go build cache warm)."""
    env = dict(os.environ, K8S_EXTRA_BINS="kubectl")
    subprocess.run([str(REPO / "hack" / "build-k8s.sh")], env=env, check=True, timeout=3600)
    paths = subprocess.run([str(REPO / "hack" / "build-k8s.sh"), "--paths"], env=env, check=True,
                           capture_output=True, text=True).stdout
    return next(line.split("=", 1)[1] for line in paths.splitlines() if line.startswith("KUBECTL="))


def ansible_env() -> dict:
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
                PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")


def host_count(argv: list[str], env: dict) -> int:
    """Hosts in the JSON of ``ansible-inventory … --list`` (checks that the inventory really has every VM)."""
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=True)
    return len(json.loads(proc.stdout)["_meta"]["hostvars"])


def pair_order(round_no: int) -> tuple[str, ...]:
    """The layouts in the order they run in round ``round_no``: flat first in even rounds, nested first in odd."""
    return LAYOUTS if round_no % 2 == 0 else LAYOUTS[::-1]


def measure_kubernetes(kubeconfig: str, runs: int) -> dict[str, Any]:
    from kubernetes import client, config

    work = Path(tempfile.mkdtemp(prefix="zjusct-inv-bench-"))
    try:
        env = ansible_env()
        sources = {}
        for layout in LAYOUTS:
            sources[layout] = work / f"{layout}.cloudvm.yml"
            sources[layout].write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "kubeconfig": kubeconfig,
                                                       "hostvars_layout": layout}))
        cached = work / "cached.cloudvm.yml"
        cached.write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "kubeconfig": kubeconfig, "cache": True,
                                          "cache_plugin": "ansible.builtin.jsonfile",
                                          "cache_connection": str(work / "cache"), "cache_timeout": 3600}))
        empty = work / "empty.ini"
        empty.write_text("")
        script = work / "baseline.py"
        script.write_text(BASELINE)
        inv = str(VENV_BIN / "ansible-inventory")
        hosts = {layout: host_count([inv, "-i", str(sources[layout]), "--list"], env) for layout in LAYOUTS}
        kubectl = [kubectl_binary(), "--kubeconfig", kubeconfig, "get", "cloudvms", "-A", "-o", "json"]
        items = json.loads(subprocess.run(kubectl, capture_output=True, text=True, check=True, timeout=1800).stdout)
        running = sum(1 for vm in items["items"] if (vm.get("status") or {}).get("phase") == "Running")
        if running != max(hosts.values()):  # the inventory's hosts are the Running CloudVMs
            raise SystemExit(f"kubectl listed {running} Running CloudVMs, the inventory {hosts}")
        host_count([inv, "-i", str(cached), "--list"], env)  # warm the cache
        api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))

        def list_only() -> tuple[float, float]:
            t0, c0 = time.monotonic(), time.process_time()
            token, n = None, 0
            while True:
                page = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=500, _continue=token,
                                                      _request_timeout=120)
                n += len(page["items"])
                token = page["metadata"].get("continue")
                if not token:
                    break
            return time.monotonic() - t0, time.process_time() - c0

        figures: Figures = {}
        split: dict[str, list[float]] = {}
        orders = []

        def add(name: str, value: tuple[float, float]) -> None:
            figures.setdefault(name, []).append(value)

        for round_no in range(runs):  # interleaved, so load changes hit every figure alike
            add("kubectl", timed(kubectl, env))
            add("baseline", timed([str(VENV_BIN / "python"), str(script), kubeconfig], env))
            add("baseline_list_only", list_only())
            add("floor", timed([inv, "-i", str(empty), "--list"], env))
            order = pair_order(round_no)
            orders.append(order[0])
            for layout in order:
                add(f"inventory_{layout}", timed([inv, "-i", str(sources[layout]), "--list"], env))
            add("inventory_export", timed([inv, "-i", str(sources["flat"]), "--list", "--export"], env))
            add("inventory_cached", timed([inv, "-i", str(cached), "--list"], env))
            for layout in order:
                add(f"list_hosts_{layout}", timed([str(VENV_BIN / "ansible"), "-i", str(sources[layout]), "all",
                                                   "--list-hosts", "-vvv"], env, split=split, split_key=f"_{layout}"))
        return {"hosts": hosts, "figures": figures, "split": split, "first": orders}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# One stand-in launcher for every VM: raises its open-file limit, takes each lock file named on stdin (one a line),
# says "locked N"; "boot-1.json" on its command line attributes the locks to boot 1, as a real launcher's argv does.
HOLDER = """
import fcntl, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for path in sys.stdin.read().split():
    fh = open(path, "a")
    fcntl.flock(fh, fcntl.LOCK_EX)
    held.append(fh)
print("locked", len(held), flush=True)
time.sleep(86400)
"""
HOST_BASELINE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as host_config
from ansible_collections.zjusct.cloud.plugins.module_utils.host.cloudvm import observed_vms
vms = observed_vms(host_config.load(sys.argv[2]))
print(sum(1 for vm in vms if vm["status"].get("phase") == "Running"))
"""


def build_host_fleet(root: Path, count: int) -> tuple[Path, subprocess.Popen]:
    """A host configuration whose store holds ``count`` VMs, Running with boot 1, and the process holding their
    launcher locks (stop it with :func:`benchlib.stop_process`)."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < count + 64:
        raise SystemExit(f"--host-vms {count}: one process holds every launcher lock, but the open-file limit is "
                         f"{hard}; raise it (ulimit -Hn) or lower --host-vms")
    config = root / "host.json"
    cfg_doc = {"store_path": str(root / "lib" / "cloud.db"), "node": "hv1", "state_dir": str(root / "state"),
               "runtime_dir": str(root / "run")}
    config.write_text(json.dumps(cfg_doc))
    earlier = time.time() - 60
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(earlier))
    locks = []
    with HostStore(cfg_doc["store_path"]) as db, db.transaction():
        for i in range(count):
            name = f"vm-{i:05d}"
            db.create_vm(NAMESPACE, name, {"owner": f"user{i % 500}", "vcpus": 1 + i % 4, "memoryMiB": 512,
                                           "bootID": 1, "powerState": "Running"},
                         labels={"cloud.zjusct.io/course": f"c{i % 20}"})
            db.update_vm(NAMESPACE, name, status={
                "phase": "Running", "reason": "SSHReady", "bootID": 1, "node": "hv1",
                "sshEndpoint": {"host": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", "port": 22},
                "sshProxyCommand": "ip netns exec zjusct-cloud nc %h %p"})
            state = root / "state" / "vms" / f"{NAMESPACE}_{name}"
            runtime = root / "run" / "vms" / f"{NAMESPACE}_{name}"
            state.mkdir(parents=True)
            runtime.mkdir(parents=True)
            (state / "boot-1.json").write_text("{}")
            (state / "spawned-1").write_text(json.dumps({"pid": 1, "time": earlier, "startedAt": stamp}))
            (state / "ready-1").write_text(json.dumps({"readyAt": stamp}))
            locks.append(str(runtime / "launcher.lock"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root / "boot-1.json")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n".join(locks))
    holder.stdin.close()
    line = holder.stdout.readline().strip()
    if line != f"locked {count}":
        stop_process(holder)
        raise SystemExit(f"the stand-in launcher did not take the {count} locks: {line!r}")
    return config, holder


def measure_host(count: int, runs: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="zjusct-inv-bench-host-"))
    holder = None
    try:
        t0 = time.monotonic()
        config, holder = build_host_fleet(root, count)
        build_s = time.monotonic() - t0
        env = ansible_env()
        sources = {}
        for layout in LAYOUTS:
            sources[layout] = root / f"{layout}.cloudvm.yml"
            sources[layout].write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "source": "host",
                                                       "host_config": str(config), "hostvars_layout": layout}))
        inv = str(VENV_BIN / "ansible-inventory")
        baseline = [str(VENV_BIN / "python"), "-c", HOST_BASELINE, str(REPO / ".collections"), str(config)]
        running = int(subprocess.run(baseline, capture_output=True, text=True, check=True, timeout=1800).stdout)
        hosts = {layout: host_count([inv, "-i", str(sources[layout]), "--list"], env) for layout in LAYOUTS}
        figures: Figures = {}
        orders = []
        for round_no in range(runs):
            figures.setdefault("host_baseline", []).append(timed(baseline, env))
            order = pair_order(round_no)
            orders.append(order[0])
            for layout in order:
                figures.setdefault(f"host_{layout}", []).append(timed([inv, "-i", str(sources[layout]), "--list"],
                                                                      env))
        return {"running": running, "hosts": hosts, "figures": figures, "build_s": build_s, "first": orders}
    finally:
        if holder is not None:
            stop_process(holder)
        shutil.rmtree(root, ignore_errors=True)


def summary(figures: Figures) -> dict[str, dict[str, float]]:
    """Best and median of wall and CPU seconds per figure."""
    out = {}
    for key, values in figures.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        out[key] = {"best_wall": min(walls), "median_wall": statistics.median(walls),
                    "best_cpu": min(cpus), "median_cpu": statistics.median(cpus)}
    return out


def pair_ratios(figures: Figures, a: str, b: str) -> dict[str, list[float]]:
    """Per round ``a / b`` of wall and of CPU seconds (the two ran back to back in that round)."""
    return {"wall": [x[0] / y[0] for x, y in zip(figures[a], figures[b], strict=True)],
            "cpu": [x[1] / y[1] for x, y in zip(figures[a], figures[b], strict=True)]}


def ratios(s: dict[str, dict[str, float]], figures: Figures, pairs: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Same-run ratios: best and median wall, median CPU, and the per-round ratios of paired figures."""
    out: dict[str, Any] = {}
    for name, a, b in pairs:
        if a not in s or b not in s:
            continue
        out[name] = {"best_wall": s[a]["best_wall"] / s[b]["best_wall"],
                     "median_wall": s[a]["median_wall"] / s[b]["median_wall"],
                     "median_cpu": s[a]["median_cpu"] / s[b]["median_cpu"],
                     "per_round": pair_ratios(figures, a, b)}
    return out


K8S_RATIOS = [("inventory_flat / kubectl", "inventory_flat", "kubectl"),
              ("inventory_nested / kubectl", "inventory_nested", "kubectl"),
              ("inventory_export / kubectl", "inventory_export", "kubectl"),
              ("inventory_cached / kubectl", "inventory_cached", "kubectl"),
              ("baseline / kubectl", "baseline", "kubectl"),
              ("inventory_flat / baseline", "inventory_flat", "baseline"),
              ("inventory_nested / baseline", "inventory_nested", "baseline"),
              ("inventory_nested / inventory_flat", "inventory_nested", "inventory_flat"),
              ("inventory_export / baseline", "inventory_export", "baseline"),
              ("inventory_cached / baseline", "inventory_cached", "baseline"),
              ("list_hosts_nested / list_hosts_flat", "list_hosts_nested", "list_hosts_flat"),
              ("inventory_flat / baseline_list_only", "inventory_flat", "baseline_list_only")]
HOST_RATIOS = [("host_flat / host_baseline", "host_flat", "host_baseline"),
               ("host_nested / host_baseline", "host_nested", "host_baseline"),
               ("host_nested / host_flat", "host_nested", "host_flat")]


def print_part(title: str, s: dict[str, dict[str, float]], r: dict[str, Any], first: list[str]) -> None:
    print(f"\n{title} (first of each pair per round: {', '.join(first)})")
    print(f"{'figure':<24}{'best s':>9}{'median s':>10}{'best CPU s':>12}{'median CPU s':>14}")
    for key, v in s.items():
        print(f"{key:<24}{v['best_wall']:>9.2f}{v['median_wall']:>10.2f}{v['best_cpu']:>12.2f}{v['median_cpu']:>14.2f}")
    for name, v in r.items():
        rounds = " ".join(f"{x:.2f}" for x in v["per_round"]["wall"])
        print(f"same-run ratio {name:<38} best {v['best_wall']:.2f}x, median {v['median_wall']:.2f}x, "
              f"median CPU {v['median_cpu']:.2f}x; per round {rounds}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=10000)
    parser.add_argument("--host-vms", type=int, help="VMs in the host store (default: --vms)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--kubeconfig", help="admin kubeconfig of a running cluster (default: start one)")
    parser.add_argument("--skip-kubernetes", action="store_true")
    parser.add_argument("--skip-host", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    host_vms = args.host_vms or args.vms
    load_before = os.getloadavg()
    report: dict[str, Any] = {"vms": args.vms, "runs": args.runs, "cpus": os.cpu_count(),
                              "loadavg_before": load_before}
    if not args.skip_kubernetes:
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
            populate_s = populate(kubeconfig, args.vms, args.threads) if running_count(kubeconfig) < args.vms else 0.0
            result = measure_kubernetes(kubeconfig, args.runs)
        finally:
            if cluster is not None:
                cluster.stop()
        s = summary(result["figures"])
        s.update({k: {"best_wall": min(v), "median_wall": statistics.median(v), "best_cpu": float("nan"),
                      "median_cpu": float("nan")} for k, v in result["split"].items()})
        report["kubernetes"] = {"hosts_listed": result["hosts"], "populate_s": round(populate_s, 1), "figures": s,
                                "rounds": result["figures"], "first": result["first"],
                                "ratios": ratios(s, result["figures"], K8S_RATIOS)}
    if not args.skip_host:
        result = measure_host(host_vms, args.runs)
        s = summary(result["figures"])
        report["host"] = {"vms": host_vms, "running": result["running"], "hosts_listed": result["hosts"],
                          "build_s": round(result["build_s"], 1), "figures": s, "rounds": result["figures"],
                          "first": result["first"], "ratios": ratios(s, result["figures"], HOST_RATIOS)}
    report["loadavg_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{os.cpu_count()} CPUs; load average before {load_before[0]:.1f} / {load_before[1]:.1f} / "
          f"{load_before[2]:.1f}, after {report['loadavg_after'][0]:.1f} / {report['loadavg_after'][1]:.1f} / "
          f"{report['loadavg_after'][2]:.1f}")
    if "kubernetes" in report:
        k = report["kubernetes"]
        print(f"Kubernetes: {args.vms} Running CloudVMs (hosts listed: {k['hosts_listed']}); populate "
              f"{k['populate_s']:.1f} s")
        print_part("Kubernetes source", k["figures"], k["ratios"], k["first"])
        for peer, what in (("kubectl", "goal"), ("baseline", "reference, no goal")):
            flat, nested = k["ratios"][f"inventory_flat / {peer}"], k["ratios"][f"inventory_nested / {peer}"]
            print(f"<= 2x {peer} ({what}): flat {'yes' if flat['median_wall'] <= 2 else 'no'} "
                  f"({flat['median_wall']:.2f}x median), nested {'yes' if nested['median_wall'] <= 2 else 'no'} "
                  f"({nested['median_wall']:.2f}x median)")
        print(f"goal <= 2 s: inventory_flat median {k['figures']['inventory_flat']['median_wall']:.2f} s")
    if "host" in report:
        h = report["host"]
        print(f"\nHost store: {h['vms']} VMs, {h['running']} Running as the listing derives them (hosts listed: "
              f"{h['hosts_listed']}); store + launcher files written in {h['build_s']:.1f} s")
        print_part("Host source", h["figures"], h["ratios"], h["first"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
