"""Leader election of the controller (controller/zjusct_controller/leader.py) on the real API server: of two
controller processes with ``--leader-elect``, only the Lease holder reconciles (the standby's reconcile counter stays
0 while a CloudVM is created and reconciled); killing the leader (SIGKILL: no release) hands the Lease over and the
former standby reconciles the next CloudVM. No guest boots: the CloudVMs name a missing root volume claim, so a
reconcile ends in Blocked/VolumeClaimNotReady with the finalizer added.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from kubernetes import client

from tests.cluster import wait_for
from tests.integration.controller_process import Controller

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]
FINALIZER = "cloud.zjusct.io/launcher"


def _proc(name: str, kubeconfig: Path, cfg: Path, ns: str, lease: str, log: Path) -> Controller:
    """A controller process competing for the Lease ``lease`` as ``name`` (6 s leases, resync every 5 s)."""
    return Controller(kubeconfig, cfg, ns, log, resync=5, extra_args=[
        "--leader-elect", lease, "--identity", name, "--lease-seconds", "6"]).start()


@pytest.fixture
def procs(k8s_cluster: Any, k8s_namespace: str, cloudvm_crd: Any, tmp_path: Path) -> Iterator[list[Controller]]:
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
                               "cmdline": "console=ttyS0"}))
    lease = f"{k8s_namespace}/cloudvm-controller"
    made = [_proc(n, k8s_cluster.kubeconfig, cfg, k8s_namespace, lease, tmp_path / f"{n}.log") for n in ("a",)]
    try:
        yield made
    finally:
        for p in made:
            p.stop()
        for p in made:
            print(p.log.read_text(errors="replace")[-3000:])


def _vm(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": name},
            "spec": {"owner": "alice", "rootVolumeClaim": f"{name}-root", "vcpus": 1, "memoryMiB": 512,
                     "powerState": "Running", "bootID": 1}}


def test_only_the_lease_holder_reconciles_and_killing_it_hands_over(
    procs: list[Controller], k8s_cluster: Any, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    coord = client.CoordinationV1Api(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    ns = k8s_namespace

    def holder() -> str | None:
        return coord.read_namespaced_lease("cloudvm-controller", ns).spec.holder_identity

    wait_for(lambda: holder() == "a", 60, "a holds the Lease")
    a = procs[0]
    b = _proc("b", k8s_cluster.kubeconfig, tmp_path / "controller.json", ns, f"{ns}/cloudvm-controller",
             tmp_path / "b.log")
    procs.append(b)
    wait_for(lambda: b.reconciles() == 0, 60, "b serves its metrics (standby)")

    def blocked(name: str) -> dict[str, Any] | None:
        vm = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        status = vm.get("status") or {}
        return vm if status.get("phase") == "Blocked" else None

    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _vm("vm1"))
    vm1 = wait_for(lambda: blocked("vm1"), 60, "vm1 Blocked", interval=0.5)
    assert vm1["status"]["reason"] == "VolumeClaimNotReady", vm1["status"]
    assert FINALIZER in vm1["metadata"]["finalizers"]
    wait_for(lambda: a.reconciles() >= 2, 60, "a resyncs")  # resync every 5 s: b had time to reconcile too
    assert b.reconciles() == 0 and holder() == "a"

    a.stop(signal.SIGKILL)  # no release: b must wait the Lease out
    wait_for(lambda: holder() == "b", 60, "b takes the Lease", interval=0.5)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _vm("vm2"))
    vm2 = wait_for(lambda: blocked("vm2"), 60, "vm2 Blocked (reconciled by b)", interval=0.5)
    assert vm2["status"]["reason"] == "VolumeClaimNotReady" and FINALIZER in vm2["metadata"]["finalizers"]
    assert b.reconciles() >= 1
    for name in ("vm1", "vm2"):  # b removes the finalizers on delete (no launcher Pod exists)
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"], 60,
             "CloudVMs deleted")
