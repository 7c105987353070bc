"""Benchmark of the test control plane (tests/cluster): cold build time, warm start time, RSS.

    /var/cache/zjusct-cloud/venv/bin/python bench/k8s_controlplane.py [--runs 3] [--settle 10] [--json]

* cold build time: from the stamp files written by hack/build-k8s.sh (seconds per binary and the
  wall time from the first build start to the last build end); "n/a" when binaries were not built here;
* warm start time: binaries cached, seconds from spawning the processes to kube-apiserver
  ``/readyz`` ok, and to "usable" (controllers healthy, nodes Ready and untainted, tenant RBAC
  aggregated); target ≤ 15 s to /readyz;
* RSS (MiB, from /proc/<pid>/status VmRSS) of etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler, ``--settle`` seconds after the cluster became usable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import rss_mib  # bench/benchlib.py

from tests.cluster import Binaries, Cluster


def cold_build() -> dict[str, Any]:
    """Build durations from the stamp files: ``{"per_binary_s": {...}, "wall_s": float | None}``."""
    stamps = Binaries.pinned().stamps()
    per = {name: int(s["build_seconds"]) for name, s in stamps.items() if "build_seconds" in s}
    starts = [int(s["build_started"]) for s in stamps.values() if "build_started" in s]
    ends = [int(s["build_finished"]) for s in stamps.values() if "build_finished" in s]
    wall = (max(ends) - min(starts)) if starts and ends and len(stamps) == 4 else None
    return {"per_binary_s": per, "wall_s": wall}


def warm_start(runs: int, settle: float) -> dict[str, Any]:
    """Start and stop the cluster ``runs`` times; returns timings (s) and RSS (MiB) of the last run."""
    readyz, usable = [], []
    rss: dict[str, float] = {}
    for i in range(runs):
        cluster = Cluster()
        try:
            cluster.start()
            readyz.append(cluster.timings["readyz_s"])
            usable.append(cluster.timings["usable_s"])
            if i == runs - 1:
                time.sleep(settle)
                rss = {name: round(rss_mib(pid), 1) for name, pid in cluster.pids().items()}
        finally:
            cluster.stop()
    return {
        "runs": runs,
        "readyz_s": [round(x, 2) for x in readyz],
        "usable_s": [round(x, 2) for x in usable],
        "readyz_median_s": round(statistics.median(readyz), 2),
        "usable_median_s": round(statistics.median(usable), 2),
        "rss_mib": rss,
        "rss_total_mib": round(sum(rss.values()), 1),
    }


def main() -> int:
    """Run the benchmark and print the figures (text or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="warm starts to time (default 3)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after usable before RSS (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    binaries = Binaries.pinned()
    reason = binaries.missing_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    result: dict[str, Any] = {
        "kubernetes": binaries.k8s_version,
        "etcd": binaries.etcd_version,
        "cold_build": cold_build(),
        "warm_start": warm_start(args.runs, args.settle),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cb, ws = result["cold_build"], result["warm_start"]
    print(f"kubernetes v{result['kubernetes']}, etcd v{result['etcd']}")
    per = ", ".join(f"{k} {v} s" for k, v in cb["per_binary_s"].items()) or "n/a"
    wall = f"{cb['wall_s']} s" if cb["wall_s"] is not None else "n/a"
    print(f"cold build: wall {wall} ({per})")
    print(f"warm start to /readyz: median {ws['readyz_median_s']} s  runs {ws['readyz_s']}  (target <= 15 s)")
    print(f"warm start to usable:  median {ws['usable_median_s']} s  runs {ws['usable_s']}")
    rss = ", ".join(f"{k} {v} MiB" for k, v in ws["rss_mib"].items())
    print(f"RSS after {args.settle:g} s: {rss}; total {ws['rss_total_mib']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
