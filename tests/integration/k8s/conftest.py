"""Fixtures for tests against the real Kubernetes control plane started by ``tests.cluster``.

* ``k8s_cluster`` (session): etcd + kube-apiserver + kube-controller-manager + kube-scheduler,
  two registered nodes with a heartbeat, admin and tenant kubeconfigs. Stopped at session end,
  also when tests fail (and killed with the test process if that dies: PR_SET_PDEATHSIG).
* ``k8s_namespace`` (function): a fresh namespace, deleted afterwards (Pods force-deleted first:
  without a kubelet nobody would confirm their graceful termination).
* Component gate: a test marked ``k8s`` whose binaries are not built FAILS when ``CI=true`` and is
  skipped with the reason (run ``hack/build-k8s.sh``) otherwise.

Set ``ZJUSCT_K8S_KEEP=1`` to keep the state dir (logs under ``<dir>/logs``) after the session.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import CONTROL_PLANE_WAIT, Binaries, Cluster, ClusterError, acquire_shared, release_shared, wait_for
from tests.conftest import require
from tests.integration.controller_process import release_launcher_pods

TEST_GROUP = "test.zjusct.io"
WIDGET_PLURAL = "widgets"


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``k8s`` marker (also declared in pyproject.toml; registering twice is harmless)."""
    config.addinivalue_line("markers", "k8s: needs the real Kubernetes control plane (tests/cluster)")


def require_k8s_binaries() -> None:
    """Fail (CI=true) or skip (otherwise) the current test when the control-plane binaries are missing."""
    reason = Binaries.pinned().missing_reason()
    require("k8s", reason is None, reason or "")


@pytest.fixture(autouse=True)
def _k8s_component_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("k8s") is not None:
        require_k8s_binaries()


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """The session's control plane (see ``tests.cluster.Cluster``)."""
    require_k8s_binaries()
    try:
        # one control plane per session even where other conftest files re-export this fixture
        cluster = acquire_shared(keep_state=bool(os.environ.get("ZJUSCT_K8S_KEEP")))
    except ClusterError as exc:
        pytest.fail(f"control plane did not start: {exc}")
    try:
        yield cluster
    finally:
        release_shared()


@pytest.fixture(scope="session")
def k8s_api(k8s_cluster: Cluster) -> Iterator[Any]:
    """An admin ``ApiClient`` (group ``system:masters``)."""
    api = k8s_cluster.api_client("admin")
    yield api
    api.close()


@pytest.fixture(scope="session")
def tenant_api(k8s_cluster: Cluster) -> Iterator[Any]:
    """An ``ApiClient`` for the limited user ``alice`` (``edit`` in namespace ``tenant-alice`` only)."""
    api = k8s_cluster.api_client("alice")
    yield api
    api.close()


def _ns_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{stem}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def k8s_namespace(k8s_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace for one test (its ``default`` ServiceAccount exists); deleted afterwards."""
    core = client.CoreV1Api(k8s_api)
    name = _ns_name(request.node.name)
    core.create_namespace({"metadata": {"name": name, "labels": {"cloud.zjusct.io/test": "true"}}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), CONTROL_PLANE_WAIT, "default SA")
    yield name
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    release_launcher_pods(core, name)  # the controller's finalizer on Pods no controller released
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


@pytest.fixture(scope="session")
def widget_crd(k8s_api: Any) -> Iterator[dict[str, str]]:
    """A namespaced CRD ``widgets.test.zjusct.io/v1`` with CEL rules and a status subresource.

    Rules: ``spec.minReplicas <= spec.maxReplicas`` (message "minReplicas must not exceed
    maxReplicas") and ``spec.owner`` immutable (message "owner is immutable").

    Yields:
        ``{"group", "version", "plural", "kind"}``.
    """
    ext = client.ApiextensionsV1Api(k8s_api)
    name = f"{WIDGET_PLURAL}.{TEST_GROUP}"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["owner", "minReplicas", "maxReplicas"],
                "properties": {
                    "owner": {
                        "type": "string",
                        "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "owner is immutable"}],
                    },
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 0},
                    "color": {"type": "string"},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "self.minReplicas <= self.maxReplicas",
                        "message": "minReplicas must not exceed maxReplicas",
                        "fieldPath": ".minReplicas",
                    }
                ],
            },
            "status": {
                "type": "object",
                "properties": {"phase": {"type": "string"}, "observedGeneration": {"type": "integer"}},
            },
        },
    }
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": TEST_GROUP,
            "scope": "Namespaced",
            "names": {"plural": WIDGET_PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:  # already there: this conftest is imported by another directory too
            raise

    def established() -> bool:
        got = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (got.status.conditions or [])}
        return conds.get("Established") == "True"

    wait_for(established, CONTROL_PLANE_WAIT, f"CRD {name} Established")
    # the CR endpoint is served a moment after Established; list until it answers
    wait_for(
        lambda: (
            client.CustomObjectsApi(k8s_api).list_cluster_custom_object(TEST_GROUP, "v1", WIDGET_PLURAL) is not None
        ),
        30,
        f"{name} served",
    )
    yield {"group": TEST_GROUP, "version": "v1", "plural": WIDGET_PLURAL, "kind": "Widget"}
    with contextlib.suppress(ApiException):
        ext.delete_custom_resource_definition(name)


def pod_manifest(name: str, resources: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A one-container Pod whose container requests (and limits) ``resources``.

    Extended resources such as ``cloud.zjusct.io/bandwidth-mbps`` cannot be overcommitted, so the
    limits equal the requests. The image is never pulled (no kubelet).
    """
    res = resources or {}
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/zjusct/none:0"}
    if res:
        container["resources"] = {"requests": dict(res), "limits": dict(res)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "restartPolicy": "Never", **spec},
    }


@pytest.fixture
def make_pod(k8s_api: Any, k8s_namespace: str) -> Any:
    """Factory: ``make_pod(name, resources=None, **spec)`` creates a Pod in the test namespace."""
    core = client.CoreV1Api(k8s_api)

    def _make(name: str, resources: dict[str, str] | None = None, **spec: Any) -> Any:
        return core.create_namespaced_pod(k8s_namespace, pod_manifest(name, resources, **spec))

    return _make
