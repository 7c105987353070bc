"""Helpers shared by the bench scripts: percentiles, timing, process RSS and the clean stop of a helper process.

Imported as ``import benchlib`` (a bench script's own directory is first on ``sys.path`` when it runs as
``python bench/<script>.py``; a script imported from elsewhere puts ``bench/`` there first, as qos_apply.py does).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` by the nearest-rank method (no interpolation).

    Args:
        values: the samples (any unit; the result has the same unit), at least one.
        p: the percentile, 0 < p <= 100.

    Returns:
        The smallest sample such that at least ``p`` % of the samples are less than or equal to it.

    Raises:
        ValueError: ``values`` is empty or ``p`` is outside (0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile p={p} outside (0, 100]")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def timed(fn: Callable[[], object]) -> float:
    """Seconds (monotonic clock, fractional) that ``fn()`` took; its result is discarded, exceptions propagate."""
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS of /proc/<pid>/status).

    Raises:
        OSError: the process does not exist.
        ValueError: /proc/<pid>/status has no VmRSS line (a zombie or kernel thread).
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL it and reap it.

    Returns:
        The process's exit status (negative: the signal that ended it).
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


# The taint docs/kubernetes.md tells the operator to put on a lost node before starting its VMs elsewhere.
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def local_cluster_operator() -> tuple[dict, dict[str, str]]:
    """What the operator of the local cluster (``hack/cluster.sh``, docs/kubernetes.md) works with: the cluster's
    ``status --json`` (kubeconfig, Ceph paths, nodes) and the environment the docs export for the playbooks (this
    venv's commands first on PATH, the kubernetes backend, the admin kubeconfig and Ceph identity).

    Raises:
        subprocess.CalledProcessError: no local cluster is up (``hack/cluster.sh status`` failed).
    """
    repo = Path(__file__).resolve().parent.parent
    status = json.loads(subprocess.run([str(repo / "hack" / "cluster.sh"), "status", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ZJUSCT_CLOUD_BACKEND": "kubernetes",
           "K8S_AUTH_KUBECONFIG": status["kubeconfig"], "CEPH_CONF": status["ceph_conf"],
           "CEPH_KEYRING": status["ceph_keyring"], "CEPH_USER": "admin"}
    return status, env


def taint_argv(node: str, state: str) -> list[str]:
    """``ansible localhost -m kubernetes.core.k8s_taint`` putting (``state`` present) or removing (absent) the
    :data:`OUT_OF_SERVICE` taint of ``node``: the operator's step of docs/kubernetes.md."""
    spec = {"name": node, "state": state, "taints": [OUT_OF_SERVICE]}
    return [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "kubernetes.core.k8s_taint",
            "-a", json.dumps(spec)]
