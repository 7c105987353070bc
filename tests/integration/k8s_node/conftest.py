"""Fixtures for tests on a real node (containerd + kubelet) of the test control plane.

* ``k8s_cluster`` (session): a control plane of its own, not the shared one of tests/integration/k8s: the real
  node's Node object changes what the scheduler reports to other tests ("0/3 nodes are available", one more
  tainted node). ``k8s_api`` and ``k8s_namespace`` are imported from tests/integration/k8s/conftest.py and resolve
  to this cluster here.
* ``real_node`` (session): :class:`tests.cluster.RealNode` joined to the session's control plane; torn down at
  session end, also when tests fail (its daemons die with the test process: PR_SET_PDEATHSIG). One per machine:
  a second session waits for the lock.
* ``launcher_image`` (session): ``playbooks/launcher_image.yml`` (cached archive under
  ``${ZJUSCT_CACHE}/launcher-image``) imported into the real node's containerd.

Tests here are marked ``kubelet`` (and ``k8s``): under ``CI=true`` a missing containerd, runc or kubelet binary
fails them (tests/conftest.py gate).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, ClusterError, RealNode, RealNodeError
from tests.conftest import require_real_node
from tests.guest_image_fixture import ansible_playbook
from tests.integration.k8s.conftest import (  # noqa: F401  (fixtures re-exported for this directory)
    _k8s_component_gate,
    k8s_api,
    k8s_namespace,
    require_k8s_binaries,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """The real node's own control plane (stopped at session end, also when tests fail)."""
    require_k8s_binaries()
    cluster = Cluster(keep_state=bool(os.environ.get("ZJUSCT_K8S_KEEP")))
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"control plane did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_node(k8s_cluster: Cluster) -> Iterator[RealNode]:
    """A real node named ``real-node`` (Pods: spec fields from ``pod_placement()``: nodeSelector + toleration)."""
    require_real_node()
    node = RealNode(k8s_cluster.state_dir)
    try:
        node.start()
    except (RealNodeError, TimeoutError) as exc:
        pytest.fail(f"real node did not start: {exc}")
    try:
        yield node
    finally:
        node.stop()


def build_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory, kind: str) -> dict[str, Any]:
    """Run ``playbooks/<kind>_image.yml`` (``launcher`` or ``controller``) without its own import, then import the
    archive into the real node. Returns the playbook's report, ``{"tag", "archive", "key"}``."""
    report = tmp_path_factory.mktemp(f"{kind}-image") / "report.json"
    argv = [ansible_playbook(), f"playbooks/{kind}_image.yml", "-e", f'{{"{kind}_image_import": false}}',
            "-e", f"{kind}_image_report_file={report}"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    info: dict[str, Any] = json.loads(report.read_text())
    real_node.import_image(Path(info["archive"]))
    return info


@pytest.fixture(scope="session")
def launcher_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"tag", "archive", "key"}`` of the launcher image, imported into the real node."""
    return build_image(real_node, tmp_path_factory, "launcher")
