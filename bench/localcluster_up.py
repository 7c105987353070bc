#!/usr/bin/env python3
"""The local cluster (zjusct_localcluster.LocalCluster, what ``hack/cluster.sh up`` runs): up and down times and
each node's agents' RSS.

Measures ``--runs`` times in one process: ``up`` (host side, control plane, every node, Ceph), the per-node steps
(namespaces, containerd, images, kubelet registered, kube-proxy + kube-router synced, Ready), the RSS (VmRSS) of
kubelet, containerd, kube-proxy and kube-router per node 10 s after up, and ``down``. The first run is "cold" in
the sense that matters after a fresh boot: the page cache has not seen the binaries and the Ceph block files are
new (the image archives and the Go build are cached: hack/build-k8s.sh's stamps give the build times); later runs
are warm. docs/kubernetes.md "Measured" has the figures.

Usage (root; from the repository root; takes the machine's real-node lock):
  /var/cache/zjusct-cloud/venv/bin/python bench/localcluster_up.py [--nodes 2] [--ceph-osds 3 | --no-ceph]
      [--runs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "localcluster"))

from zjusct_localcluster.cluster import LocalCluster  # noqa: E402


def one_run(nodes: int, ceph: bool, osds: int) -> dict[str, Any]:
    parent = Path(tempfile.mkdtemp(prefix="zjlc-bench-"))
    cluster = LocalCluster(state_dir=parent / "s", nodes=nodes, ceph=ceph, ceph_osds=osds)
    t0 = time.monotonic()
    try:
        cluster.start()
        up = time.monotonic() - t0
        time.sleep(10)
        rss = {name: node.rss_kib() for name, node in cluster.nodes.items()}
        per_node = {name: {k: round(v, 2) for k, v in node.timings.items() if k.endswith("_s")}
                    for name, node in cluster.nodes.items()}
    finally:
        t1 = time.monotonic()
        cluster.stop()
        down = time.monotonic() - t1
        shutil.rmtree(parent, ignore_errors=True)
    return {"up_s": round(up, 1), "down_s": round(down, 1),
            "steps_s": {k: round(v, 1) for k, v in cluster.timings.items()}, "nodes": per_node, "rss_kib": rss,
            "load": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ceph-osds", type=int, default=3)
    parser.add_argument("--no-ceph", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [one_run(args.nodes, not args.no_ceph, args.ceph_osds) for _ in range(args.runs)]
    for i, run in enumerate(runs):
        label = "first" if i == 0 else f"run {i + 1}"
        print(f"{label}: up {run['up_s']} s, down {run['down_s']} s, load {run['load']:.1f}; steps {run['steps_s']}")
        for name, kib in run["rss_kib"].items():
            print(f"  {name} RSS MiB: " + ", ".join(f"{k} {v / 1024:.0f}" for k, v in kib.items())
                  + f"; steps {run['nodes'][name]}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
