"""Fixtures for the inventory plugin against the real Kubernetes control plane.

The control plane, the admin/tenant clients and the per-test namespace come from
tests/integration/k8s/conftest.py (imported, not copied). ``inventory_crd`` installs the CloudVM
CRD from config/crd/ and the aggregated roles from config/rbac/ as ``kubectl apply`` would; when
another fixture of the session already installed them it reuses them and leaves them in place.
"""
# ruff: noqa: F401, F811  (pytest fixtures are re-exported and taken as parameters of the same name)

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE, wait_for
from tests.integration.inventory_k8s.inventory_k8s_helpers import (
    AGGREGATE_ROLES,
    CRD_FILE,
    GROUP,
    PLURAL,
    VERSION,
    CloudVMWriter,
    load_docs,
)
from tests.integration.k8s.conftest import (
    _k8s_component_gate,
    k8s_api,
    k8s_cluster,
    k8s_namespace,
    tenant_api,
)


@pytest.fixture(scope="session")
def inventory_crd(k8s_api: Any, tenant_api: Any) -> Iterator[dict]:
    """The CloudVM CRD and aggregated roles on the test cluster, served and aggregated into ``edit``."""
    ext = client.ApiextensionsV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    (crd,) = load_docs(CRD_FILE)
    created: list[tuple[str, str]] = []
    try:
        ext.create_custom_resource_definition(crd)
        created.append(("crd", crd["metadata"]["name"]))
    except ApiException as exc:
        if exc.status != 409:
            raise
    for role in load_docs(AGGREGATE_ROLES):
        try:
            rbac.create_cluster_role(role)
            created.append(("role", role["metadata"]["name"]))
        except ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return {c.type: c.status for c in (got.status.conditions or [])}.get("Established") == "True"

    wait_for(established, 60, "CloudVM CRD Established")
    objects = client.CustomObjectsApi(k8s_api)
    wait_for(lambda: objects.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None, 60, "cloudvms served")

    def tenant_may_list() -> bool:
        review = client.AuthorizationV1Api(tenant_api).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"namespace": TENANT_NAMESPACE, "verb": "list", "group": GROUP,
                                             "resource": PLURAL}}})
        return bool(review.status.allowed)

    wait_for(tenant_may_list, 60, "edit role aggregated with CloudVM rules")
    yield crd
    for kind, name in reversed(created):
        with contextlib.suppress(ApiException):
            if kind == "crd":
                ext.delete_custom_resource_definition(name)
            else:
                rbac.delete_cluster_role(name)


@pytest.fixture
def vms(k8s_api: Any, inventory_crd: dict) -> CloudVMWriter:
    """CloudVM writer with the admin identity (creates as a user, reports status as the controller)."""
    return CloudVMWriter(client.CustomObjectsApi(k8s_api))
