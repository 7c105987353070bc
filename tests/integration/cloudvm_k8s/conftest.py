"""Fixtures for the CloudVM API and the cloudvm modules against the real Kubernetes control plane.

* The control plane and the per-test namespace come from tests/integration/k8s/conftest.py
  (``k8s_cluster``, ``k8s_api``, ``tenant_api``, ``k8s_namespace``; imported, not copied).
* ``cloudvm_crd`` (session) creates config/crd/, config/rbac/aggregate-roles.yaml and the owner
  admission policy (config/policy/) as ``kubectl apply`` would, and waits until the CRD is served,
  the tenant's ``edit`` role has picked up the CloudVM rules through aggregation and the policy is
  enforced.
* ``play`` runs tasks through ``ansible-playbook`` with the collection from this checkout.
* ``fake_controller`` starts stand-in controller threads (see cloudvm_helpers.FakeController).
"""
# ruff: noqa: F811  (pytest fixtures take the imported fixtures as parameters of the same name)

from __future__ import annotations

import contextlib
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
    VERSION,
    CloudVMs,
    FakeController,
    PlayRun,
    load_docs,
    owner_policy_enforced,
    run_play,
)
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
    """The CloudVM CRD from config/crd/ and the aggregated roles, installed on the test cluster."""
    ext = client.ApiextensionsV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    (crd,) = load_docs(CRD_FILE)
    _create_or_keep(ext.create_custom_resource_definition, crd)
    roles = load_docs(AGGREGATE_ROLES)
    for role in roles:
        _create_or_keep(rbac.create_cluster_role, role)

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return {c.type: c.status for c in (got.status.conditions or [])}.get("Established") == "True"

    wait_for(established, 60, "CloudVM CRD Established")
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
    with contextlib.suppress(ApiException):
        ext.delete_custom_resource_definition(crd["metadata"]["name"])
    for role in roles:
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role(role["metadata"]["name"])


@pytest.fixture
def cvm_api(k8s_api: Any, cloudvm_crd: dict[str, Any]) -> CloudVMs:
    """Admin access to CloudVM objects (what kubectl would do)."""
    return CloudVMs(client.CustomObjectsApi(k8s_api))


@pytest.fixture
def fake_controller(cvm_api: CloudVMs) -> Iterator[Callable[..., FakeController]]:
    """Factory ``fake_controller(ns, name, mode="obedient")``; every controller is stopped afterwards."""
    started: list[FakeController] = []

    def _make(ns: str, name: str, mode: str = "obedient", boot_s: float = 0.5) -> FakeController:
        ctl = FakeController(cvm_api, ns, name, mode=mode, boot_s=boot_s).start()
        started.append(ctl)
        return ctl

    yield _make
    for ctl in started:
        ctl.stop()


@pytest.fixture
def play(k8s_cluster: Any, cloudvm_crd: dict[str, Any], tmp_path: Path) -> Callable[..., PlayRun]:
    """``play(tasks, check=False, diff=False, verbosity=0, user="admin", ...)`` -> :class:`PlayRun`."""

    def _play(tasks: list[dict[str, Any]], user: str = "admin", **kwargs: Any) -> PlayRun:
        kubeconfig = k8s_cluster.kubeconfigs[user] if user else None
        run = run_play(tasks, kubeconfig=kubeconfig, tmp_path=tmp_path, **kwargs)
        assert isinstance(run, PlayRun)
        return run

    return _play


