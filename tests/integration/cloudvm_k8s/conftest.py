"""Fixtures for the CloudVM API and the cloudvm modules against the real Kubernetes control plane.

* The control plane and the per-test namespace come from tests/integration/k8s/conftest.py
  (``k8s_cluster``, ``k8s_api``, ``tenant_api``, ``k8s_namespace``; imported, not copied).
* ``cloudvm_crd`` (session) creates config/crd/ (CloudVM and CloudQuota), config/rbac/aggregate-roles.yaml and the
  owner admission policy (config/policy/) as ``kubectl apply`` would, and waits until the CRDs are served,
  the tenant's ``edit`` role has picked up the CloudVM rules through aggregation and the policy is
  enforced.
* ``play`` runs tasks through ``ansible-playbook`` with the collection from this checkout.
* ``controller`` runs the real controller (tests/integration/controller_process.py) for the test's namespace with
  the rights of config/rbac/controller-role.yaml. This control plane's Nodes run no kubelet, so launcher Pods are
  created but never run: the controller's config places them with a nodeSelector no Node has, and the real
  scheduler leaves them unscheduled (Unschedulable). Guest boots are tested on the real node
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

from tests.cluster import TENANT_NAMESPACE, wait_for
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
    policy, binding = load_docs(OWNER_POLICY)
    admission = client.AdmissionregistrationV1Api(k8s_api)
    for obj in (policy, binding):  # as the cluster role applies them, so site.yml's test re-applies cleanly
        DynamicClient(k8s_api).resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).server_side_apply(
            body=obj, name=obj["metadata"]["name"], field_manager="zjusct.cloud")
    wait_for(lambda: owner_policy_enforced(tenant_api), 60, "owner admission policy enforced")
    yield crd
    with contextlib.suppress(ApiException):
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    with contextlib.suppress(ApiException):
        admission.delete_validating_admission_policy(policy["metadata"]["name"])
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
def controller(k8s_cluster: Any, k8s_api: Any, cloudvm_crd: dict[str, Any], k8s_namespace: str,
               tmp_path: Path) -> Iterator[Controller]:
    """The controller process watching ``k8s_namespace`` (serving /metrics when yielded). Its launcher Pods name
    an image no node has and the nodeSelector :data:`NO_NODE`: they stay unscheduled. At teardown every CloudVM of
    the namespace is deleted while the controller still runs (it deletes the launcher Pods and removes its
    finalizer), then the controller is stopped and its log printed. Its ServiceAccount lives in the test's
    namespace (the ClusterRole of config/rbac/controller-role.yaml, bound for this test only): the shared control
    plane keeps no zjusct-cloud-system objects that site.yml's test expects to create."""
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
                               "cmdline": "console=ttyS0", "nodeSelector": NO_NODE}))
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig",
                                       namespace=k8s_namespace)
    ctl = Controller(kubeconfig, cfg, k8s_namespace, tmp_path / "controller.log", resync=5).start()
    custom: Any = client.CustomObjectsApi(k8s_api)
    try:
        wait_for(ctl.metrics, 60, "controller serves /metrics")
        yield ctl
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)["items"],
                     60, "CloudVMs deleted")
        ctl.stop()
        delete_binding(k8s_api, k8s_namespace)
        print(ctl.tail()[-3000:])


@pytest.fixture
def play(k8s_cluster: Any, cloudvm_crd: dict[str, Any], tmp_path: Path) -> Callable[..., PlayRun]:
    """``play(tasks, check=False, diff=False, verbosity=0, user="admin", ...)`` -> :class:`PlayRun`."""

    def _play(tasks: list[dict[str, Any]], user: str = "admin", **kwargs: Any) -> PlayRun:
        kubeconfig = k8s_cluster.kubeconfigs[user] if user else None
        run = run_play(tasks, kubeconfig=kubeconfig, tmp_path=tmp_path, **kwargs)
        assert isinstance(run, PlayRun)
        return run

    return _play


