#!/usr/bin/env python3
"""Node loss -> the VM Running on the other node, against a cold start of the same VM, on the cluster of
``make quickstart-kubernetes`` and through the operator's own commands (docs/kubernetes.md "VMs on two nodes").

Each round, alternating:

* **failover**: ``hack/cluster.sh lose-node <alice's node> --how agents`` (its QEMU keeps running), the wait for
  Unknown/NodeLost, the out-of-service taint (``kubernetes.core.k8s_taint``), ``vm_start.yml -e owner=alice`` (returns
  when SSH answers): seconds from the loss to that return, fence and boot included; then ``restore-node`` and the
  taint removed (not timed);
* **baseline**: ``vm_stop.yml`` then ``vm_start.yml`` on a healthy cluster (not timed / timed): the same VM's cold
  boot through the same playbook.

Prints each round, the P50 of each and the ratio failover / baseline (same run, same machine; KubeVirt's default
for the same loss is no automatic recovery at all: the VM waits for a manual force-delete). The difference is the
node lifecycle controller's 16-s grace period, the taint and the fence.

Usage (root, from the repository root, after ``make quickstart-kubernetes``):
  /var/cache/zjusct-cloud/venv/bin/python bench/failover.py [--rounds 3] [--owner alice] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

REPO = Path(__file__).resolve().parent.parent
CLUSTER = str(REPO / "hack" / "cluster.sh")
GROUP, VERSION, PLURAL = "cloud.zjusct.io", "v1alpha1", "cloudvms"


def run(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--owner", default="alice")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    venv = Path(sys.executable).parent
    status, env = benchlib.local_cluster_operator()
    from kubernetes import client, config

    custom: Any = client.CustomObjectsApi(config.new_client_from_config(status["kubeconfig"]))

    def vm_status() -> dict[str, Any]:
        return dict(custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, args.owner)["status"])

    def taint(node: str, state: str) -> None:
        run(benchlib.taint_argv(node, state), env)

    start = [str(venv / "ansible-playbook"), "playbooks/vm_start.yml", "-e", f"owner={args.owner}"]
    stop = [str(venv / "ansible-playbook"), "playbooks/vm_stop.yml", "-e", f"owner={args.owner}"]
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        st = vm_status()
        if st.get("phase") != "Running":
            run(start, env)
            st = vm_status()
        node = st["node"]
        t0 = time.monotonic()
        run([CLUSTER, "lose-node", node, "--how", "agents"], env)
        while vm_status().get("phase") != "Unknown":
            time.sleep(0.5)
        unknown_s = time.monotonic() - t0
        taint(node, "present")
        run(start, env)
        failover_s = time.monotonic() - t0
        moved_to = vm_status()["node"]
        run([CLUSTER, "restore-node", node], env)
        taint(node, "absent")
        run(stop, env)
        baseline_s = benchlib.timed(lambda: run(start, env))
        row = {"round": i + 1, "lost": node, "moved_to": moved_to, "unknown_s": round(unknown_s, 1),
               "failover_s": round(failover_s, 1), "cold_start_s": round(baseline_s, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    fail = benchlib.percentile([r["failover_s"] for r in rows], 50)
    base = benchlib.percentile([r["cold_start_s"] for r in rows], 50)
    summary = {"rounds": rows, "failover_p50_s": fail, "cold_start_p50_s": base, "ratio": round(fail / base, 2),
               "load_avg": os.getloadavg()}
    print(f"failover P50 {fail:.1f} s, cold start P50 {base:.1f} s: {fail / base:.2f}x (same run; "
          f"load {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
