"""A CloudVM never boots another owner's root volume (docs/security.md, threat model; case: a claim of another
owner), on the real kube-apiserver with the owner policy applied and the real controller process.

In a namespace alice and bob share, bob's VM was deleted and its root volume claim kept (as ``vm_delete`` does by
default): the claim and its PersistentVolume carry bob's owner mark (``cloud.zjusct.io/owner``) and no claim mark.
alice, impersonated with ``edit`` in the namespace, creates her own CloudVM naming bob's claim: the owner policy
admits it (it is hers), and the controller must then refuse to use the claim — Blocked/VolumeOwnerMismatch naming
both owners, no launcher Pod, and no claim mark written. A PersistentVolume marked for bob under a claim marked for
alice is refused the same way. A claim and volume of alice's own start (the launcher Pod is created and the claim
marked with her VM's uid), so the refusal is the owner mark's doing.

The launcher Pods name a nodeSelector no node has (the ``controller`` fixture): they are created, never run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import CONTROL_PLANE_WAIT, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import CloudVMs
from tests.integration.controller_process import Controller

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

OWNER = "cloud.zjusct.io/owner"
CLAIMED_BY = "cloud.zjusct.io/claimed-by"
LABEL_VM = "cloud.zjusct.io/vm"


@pytest.fixture
def as_alice(k8s_cluster: Any, k8s_api: Any, k8s_namespace: str) -> Iterator[CloudVMs]:
    """CloudVM access as user alice (impersonated by the admin, as ``kubectl --as alice``) with ``edit`` in the
    shared test namespace: RBAC lets her write any CloudVM there, the owner policy only her own."""
    client.RbacAuthorizationV1Api(k8s_api).create_namespaced_role_binding(k8s_namespace, {
        "metadata": {"name": "edit-alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})
    api = k8s_cluster.api_client("admin")
    api.set_default_header("Impersonate-User", "alice")
    try:
        yield CloudVMs(client.CustomObjectsApi(api))
    finally:
        with contextlib.suppress(Exception):
            api.close()


@pytest.fixture
def volumes(k8s_api: Any, k8s_namespace: str) -> Iterator[Callable[..., dict[str, Any]]]:
    """``volumes(claim, claim_owner, pv_owner)``: a Filesystem PersistentVolume pre-bound to the claim and the
    claim bound to it, each labelled with its owner mark (None: no mark), as root_volume_claim leaves a kept root
    volume; returns the claim once Bound. The PVs are deleted afterwards."""
    core = client.CoreV1Api(k8s_api)
    made: list[str] = []

    def _make(claim: str, claim_owner: str | None, pv_owner: str | None) -> dict[str, Any]:
        pv = f"{k8s_namespace}-{claim}"
        made.append(pv)
        core.create_persistent_volume({
            "metadata": {"name": pv, "labels": {OWNER: pv_owner} if pv_owner else {}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem",
                     "hostPath": {"path": f"/nonexistent/{pv}"},
                     "claimRef": {"namespace": k8s_namespace, "name": claim}}})
        core.create_namespaced_persistent_volume_claim(k8s_namespace, {
            "metadata": {"name": claim, "labels": {OWNER: claim_owner} if claim_owner else {}},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": "",
                     "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}})

        def bound() -> dict[str, Any] | None:
            obj = client.ApiClient().sanitize_for_serialization(
                core.read_namespaced_persistent_volume_claim(claim, k8s_namespace))
            return obj if (obj.get("status") or {}).get("phase") == "Bound" else None

        return dict(wait_for(bound, CONTROL_PLANE_WAIT, f"claim {claim} Bound"))

    yield _make
    for pv in made:
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(pv)


def _status(cvm_api: CloudVMs, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    """The CloudVM's status once the controller wrote ``phase`` for its current generation, else None."""
    vm = cvm_api.get(ns, name) or {}
    status = vm.get("status") or {}
    if status.get("phase") == phase and status.get("observedGeneration") == vm["metadata"]["generation"]:
        return dict(status)
    return None


def _claim_mark(k8s_api: Any, ns: str, claim: str) -> str | None:
    pvc = client.CoreV1Api(k8s_api).read_namespaced_persistent_volume_claim(claim, ns)
    return (pvc.metadata.annotations or {}).get(CLAIMED_BY)


def _launcher_pods(k8s_api: Any, ns: str, vm: str) -> list[str]:
    pods = client.CoreV1Api(k8s_api).list_namespaced_pod(ns, label_selector=f"{LABEL_VM}={vm}").items
    return [p.metadata.name for p in pods]


@pytest.mark.parametrize(("claim_owner", "pv_owner", "marked"), [
    ("bob", "bob", "PersistentVolumeClaim"),  # bob's kept root volume, named by alice's VM
    ("alice", "bob", "PersistentVolume"),  # a claim that says alice over bob's PersistentVolume
])
def test_a_vm_naming_another_owners_claim_is_blocked_and_nothing_is_marked(
    controller: Controller, as_alice: CloudVMs, cvm_api: CloudVMs, volumes: Callable[..., dict[str, Any]],
    k8s_api: Any, k8s_namespace: str, claim_owner: str, pv_owner: str, marked: str,
) -> None:
    ns = k8s_namespace
    volumes("bob-root", claim_owner, pv_owner)
    as_alice.create(ns, "alice", rootVolumeClaim="bob-root", powerState="Running", bootID=1)  # the policy admits it
    status = wait_for(lambda: _status(cvm_api, ns, "alice", "Blocked"), CONTROL_PLANE_WAIT, "alice's VM Blocked")
    assert status["reason"] == "VolumeOwnerMismatch", status
    message = status["message"]
    assert "owner bob" in message and "not to alice (spec.owner)" in message, message
    assert f"{marked} " in message and f"metadata.labels[{OWNER}]" in message, message
    # nothing was marked and nothing was started, also after further passes (the controller resyncs every 5 s)
    wait_for(lambda: controller.reconciles() >= 3, CONTROL_PLANE_WAIT, "two more reconcile passes")
    assert _claim_mark(k8s_api, ns, "bob-root") is None
    assert _launcher_pods(k8s_api, ns, "alice") == []
    again = cvm_api.get(ns, "alice")
    assert again is not None and again["status"]["reason"] == "VolumeOwnerMismatch"


def test_a_vm_on_its_owners_claim_gets_its_launcher_pod_and_the_claim_mark(
    controller: Controller, as_alice: CloudVMs, cvm_api: CloudVMs, volumes: Callable[..., dict[str, Any]],
    k8s_api: Any, k8s_namespace: str,
) -> None:
    ns = k8s_namespace
    volumes("alice-root", "alice", "alice")
    vm = as_alice.create(ns, "alice", rootVolumeClaim="alice-root", powerState="Running", bootID=1)
    status = wait_for(lambda: _status(cvm_api, ns, "alice", "Pending"), CONTROL_PLANE_WAIT, "alice's VM Pending")
    assert status["pod"] == "alice-boot-1", status
    assert wait_for(lambda: _claim_mark(k8s_api, ns, "alice-root"), CONTROL_PLANE_WAIT, "claim mark") == \
        vm["metadata"]["uid"]
    assert _launcher_pods(k8s_api, ns, "alice") == ["alice-boot-1"]
