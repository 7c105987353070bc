"""Fixtures for the CloudVM API and the cloudvm modules against the real Kubernetes control plane.

* The control plane and the per-test namespace come from tests/integration/k8s/conftest.py
  (``k8s_cluster``, ``k8s_api``, ``tenant_api``, ``k8s_namespace``; imported, not copied).
* ``cloudvm_crd`` (session) creates config/crd/ (CloudVM and CloudQuota), config/rbac/aggregate-roles.yaml and the
  owner admission policies (config/policy/) as ``kubectl apply`` would, and waits until the CRDs are served,
  the tenant's ``edit`` role has picked up the CloudVM rules through aggregation and every policy is
  enforced.
* ``play`` runs tasks through ``ansible-playbook`` with the collection from this checkout.
* ``controller`` runs the real controller (tests/integration/controller_process.py) for the test's namespace with
  the rights of config/rbac/controller-role.yaml, as its ServiceAccount zjusct-cloud-system/cloudvm-controller.
  This control plane's Nodes run no kubelet, so launcher Pods are created but never run: the controller's config
  places them with a nodeSelector no Node has, and the real scheduler leaves them unscheduled (Unschedulable).
  ``start_controller(**config)`` starts it with another config (``nodeSelector={}``: the Pods are bound to the
  test Nodes and the kubelet stand-in reports them Running). Guest boots are tested on the real node
  (tests/integration/k8s_node).
"""
# ruff: noqa: F811  (pytest fixtures take the imported fixtures as parameters of the same name)

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.cluster import CONTROL_PLANE_WAIT, TENANT_NAMESPACE, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import (
    AGGREGATE_ROLES,
    CRD_FILE,
    GROUP,
    OWNER_POLICY,
    PLURAL,
    QUOTA_CRD_FILE,
    VERSION,
    CloudVMs,
    PlayRun,
    load_docs,
    owner_policy_enforced,
    run_play,
)
from tests.integration.controller_process import Controller, controller_kubeconfig, delete_binding
from tests.integration.k8s.conftest import (  # noqa: F401  (fixtures re-exported for this directory)
    _k8s_component_gate,
    k8s_api,
    k8s_cluster,
    k8s_namespace,
    tenant_api,
)


def _create_or_keep(create: Callable[[Any], Any], body: dict[str, Any]) -> None:
    """Create an object; one that exists already is kept (site.yml's test applies the same files)."""
    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture(scope="session")
def cloudvm_crd(k8s_api: Any, tenant_api: Any) -> Iterator[dict[str, Any]]:
    """The CloudVM and CloudQuota CRDs from config/crd/ and the aggregated roles, installed on the test cluster."""
    ext = client.ApiextensionsV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    (crd,) = load_docs(CRD_FILE)
    (quota_crd,) = load_docs(QUOTA_CRD_FILE)
    _create_or_keep(ext.create_custom_resource_definition, crd)
    _create_or_keep(ext.create_custom_resource_definition, quota_crd)
    roles = load_docs(AGGREGATE_ROLES)
    for role in roles:
        _create_or_keep(rbac.create_cluster_role, role)

    def established() -> bool:
        return all({c.type: c.status for c in (ext.read_custom_resource_definition(d["metadata"]["name"]).status
                                               .conditions or [])}.get("Established") == "True"
                   for d in (crd, quota_crd))

    wait_for(established, 60, "CloudVM and CloudQuota CRDs Established")
    objects = client.CustomObjectsApi(k8s_api)
    wait_for(lambda: objects.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None, 60, "cloudvms served")

    def tenant_may_create() -> bool:
        review = client.AuthorizationV1Api(tenant_api).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"namespace": TENANT_NAMESPACE, "verb": "create",
                                             "group": GROUP, "resource": PLURAL}}})
        return bool(review.status.allowed)

    wait_for(tenant_may_create, 60, "edit role aggregated with CloudVM rules")
    policies = load_docs(OWNER_POLICY)  # each ValidatingAdmissionPolicy and its binding
    admission = client.AdmissionregistrationV1Api(k8s_api)
    for obj in policies:  # as the cluster role applies them, so site.yml's test re-applies cleanly
        DynamicClient(k8s_api).resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).server_side_apply(
            body=obj, name=obj["metadata"]["name"], field_manager="zjusct.cloud")
    wait_for(lambda: owner_policy_enforced(tenant_api), CONTROL_PLANE_WAIT, "owner admission policies enforced")
    yield crd
    for obj in reversed(policies):
        with contextlib.suppress(ApiException):
            if obj["kind"] == "ValidatingAdmissionPolicyBinding":
                admission.delete_validating_admission_policy_binding(obj["metadata"]["name"])
            else:
                admission.delete_validating_admission_policy(obj["metadata"]["name"])
    for doc in (crd, quota_crd):
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(doc["metadata"]["name"])
    for role in roles:
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role(role["metadata"]["name"])


@pytest.fixture
def cvm_api(k8s_api: Any, cloudvm_crd: dict[str, Any]) -> CloudVMs:
    """Admin access to CloudVM objects (what kubectl would do)."""
    return CloudVMs(client.CustomObjectsApi(k8s_api))


NO_NODE = {"cloud.zjusct.io/test-no-such-node": "true"}  # the launcher Pods' nodeSelector: no Node has it


@pytest.fixture
def start_controller(k8s_cluster: Any, k8s_api: Any, cloudvm_crd: dict[str, Any], k8s_namespace: str,
                     tmp_path: Path) -> Iterator[Callable[..., Controller]]:
    """``start_controller(**config)``: the controller process watching ``k8s_namespace`` (serving /metrics when
    returned), with controller.json = an image no node has, the nodeSelector :data:`NO_NODE` (its launcher Pods
    stay unscheduled) and ``config`` on top (e.g. ``nodeSelector={}`` lets the scheduler bind them to the test
    Nodes, where the kubelet stand-in ``k8s_cluster.kubelet(node)`` reports them Running). Once per test.

    It runs as the ServiceAccount ``zjusct-cloud-system/cloudvm-controller``, the identity the owner admission
    policies exempt, with the ClusterRole of config/rbac/controller-role.yaml bound for this test only
    (:func:`controller_kubeconfig`). At teardown every CloudVM of the namespace is deleted while the controller
    still runs (it deletes the launcher Pods and removes its finalizer), then the controller is stopped and its log
    printed."""
    started: list[Controller] = []

    def _start(**config: Any) -> Controller:
        assert not started, "one controller per test"
        cfg = tmp_path / "controller.json"
        cfg.write_text(json.dumps({"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
                                   "cmdline": "console=ttyS0", "nodeSelector": NO_NODE, **config}))
        kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig",
                                           namespace=k8s_namespace)
        ctl = Controller(kubeconfig, cfg, k8s_namespace, tmp_path / "controller.log", resync=5).start()
        started.append(ctl)
        wait_for(ctl.metrics, 60, "controller serves /metrics")
        return ctl

    custom: Any = client.CustomObjectsApi(k8s_api)
    try:
        yield _start
    finally:
        if started:
            with contextlib.suppress(ApiException):
                custom.delete_collection_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)[
                    "items"], CONTROL_PLANE_WAIT, "CloudVMs deleted")
            started[0].stop()
            print(started[0].tail()[-3000:])
        delete_binding(k8s_api, k8s_namespace)


@pytest.fixture
def controller(start_controller: Callable[..., Controller]) -> Controller:
    """The controller of :func:`start_controller` with its defaults: launcher Pods are created, never scheduled."""
    return start_controller()


@pytest.fixture
def play(k8s_cluster: Any, cloudvm_crd: dict[str, Any], tmp_path: Path) -> Callable[..., PlayRun]:
    """``play(tasks, check=False, diff=False, verbosity=0, user="admin", ...)`` -> :class:`PlayRun`."""

    def _play(tasks: list[dict[str, Any]], user: str = "admin", **kwargs: Any) -> PlayRun:
        kubeconfig = k8s_cluster.kubeconfigs[user] if user else None
        run = run_play(tasks, kubeconfig=kubeconfig, tmp_path=tmp_path, **kwargs)
        assert isinstance(run, PlayRun)
        return run

    return _play




@pytest.fixture
def bound_claim(k8s_api: Any, k8s_namespace: str) -> Iterator[Callable[[str, str], str]]:
    """``bound_claim(name, owner)``: a Bound filesystem root volume claim ``name`` in the test namespace, shaped
    as zjusct.cloud.root_volume_claim makes one (owner mark ``cloud.zjusct.io/owner`` on the PV and the claim, PV
    ``<namespace>.<name>`` with reclaim policy Retain pre-bound by ``spec.claimRef``, the claim naming it in
    ``spec.volumeName``) but on a hostPath PV, which nothing mounts here; returns the PV's name. The PVs are
    deleted at teardown."""
    core: Any = client.CoreV1Api(k8s_api)
    made: list[str] = []

    def _make(name: str, owner: str) -> str:
        pv = f"{k8s_namespace}.{name}"
        core.create_persistent_volume({
            "metadata": {"name": pv, "labels": {"cloud.zjusct.io/owner": owner}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": "/nonexistent", "type": "DirectoryOrCreate"},
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": k8s_namespace,
                                  "name": name}}})
        made.append(pv)
        core.create_namespaced_persistent_volume_claim(k8s_namespace, {
            "metadata": {"name": name, "labels": {"cloud.zjusct.io/owner": owner}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: core.read_namespaced_persistent_volume_claim(name, k8s_namespace).status.phase == "Bound",
                 CONTROL_PLANE_WAIT, f"claim {name} Bound")
        return pv

    yield _make
    for pv in made:
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(pv)
