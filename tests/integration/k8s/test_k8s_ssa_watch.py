"""Server-side apply and watches through the ``kubernetes`` Python client against the real API server."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.k8s

APPLY = "application/apply-patch+yaml"  # JSON bodies are valid YAML


def _cm(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def _apply_cm(core: client.CoreV1Api, ns: str, body: dict[str, Any], manager: str, force: bool = False) -> Any:
    return core.patch_namespaced_config_map(
        body["metadata"]["name"], ns, body, field_manager=manager, force=force, _content_type=APPLY
    )


def test_server_side_apply_ownership_and_conflicts(k8s_api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    cm = _apply_cm(core, k8s_namespace, _cm("ssa", {"size": "1", "color": "red"}), "zjusct-a")
    assert cm.data == {"size": "1", "color": "red"}
    managers = {(m.manager, m.operation) for m in cm.metadata.managed_fields}
    assert ("zjusct-a", "Apply") in managers

    # a second manager changing a field owned by the first conflicts...
    with pytest.raises(ApiException) as err:
        _apply_cm(core, k8s_namespace, _cm("ssa", {"size": "2"}), "zjusct-b")
    assert err.value.status == 409
    assert "zjusct-a" in json.loads(err.value.body)["message"]
    # ...unless it forces, which moves ownership of that field
    cm = _apply_cm(core, k8s_namespace, _cm("ssa", {"size": "2"}), "zjusct-b", force=True)
    assert cm.data == {"size": "2", "color": "red"}

    # a manager that stops applying a field it alone owns removes it
    cm = _apply_cm(core, k8s_namespace, _cm("ssa", {}), "zjusct-a")
    assert cm.data == {"size": "2"}


def _apply_custom(
    custom: client.CustomObjectsApi,
    crd: dict[str, str],
    ns: str,
    body: dict[str, Any],
    manager: str,
    status: bool = False,
) -> dict[str, Any]:
    """Server-side apply of a custom resource (or its status) returning the object.

    kubernetes client 37.0.2 maps only HTTP 200 for custom-object patches, so an apply that creates
    the object (201) would return None; read the raw response instead.
    """
    patch = custom.patch_namespaced_custom_object_status if status else custom.patch_namespaced_custom_object
    resp = patch(
        crd["group"],
        crd["version"],
        ns,
        crd["plural"],
        body["metadata"]["name"],
        body,
        field_manager=manager,
        _content_type=APPLY,
        _preload_content=False,
    )
    return dict(json.loads(resp.data))


def test_server_side_apply_custom_resource_and_status(
    k8s_api: Any, k8s_namespace: str, widget_crd: dict[str, str]
) -> None:
    """Spec and status of a custom resource are applied separately; only spec bumps the generation."""
    custom = client.CustomObjectsApi(k8s_api)
    api_version = f"{widget_crd['group']}/{widget_crd['version']}"
    body = {
        "apiVersion": api_version,
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"owner": "alice", "minReplicas": 1, "maxReplicas": 2},
    }
    obj = _apply_custom(custom, widget_crd, k8s_namespace, body, "user")
    assert obj["metadata"]["generation"] == 1
    status = {
        "apiVersion": api_version,
        "kind": "Widget",
        "metadata": {"name": "w"},
        "status": {"phase": "Ready", "observedGeneration": 1},
    }
    obj = _apply_custom(custom, widget_crd, k8s_namespace, status, "controller", status=True)
    assert obj["status"]["phase"] == "Ready"
    assert obj["metadata"]["generation"] == 1
    body["spec"]["maxReplicas"] = 3
    obj = _apply_custom(custom, widget_crd, k8s_namespace, body, "user")
    assert obj["metadata"]["generation"] == 2
    assert obj["status"]["phase"] == "Ready"  # spec writes do not touch status


def test_watch_sees_add_modify_delete(k8s_api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    start_rv = core.list_namespaced_config_map(k8s_namespace).metadata.resource_version
    seen: list[tuple[str, str, dict[str, str] | None]] = []
    errors: list[BaseException] = []

    def run() -> None:
        w = watch.Watch()
        try:
            for ev in w.stream(
                core.list_namespaced_config_map, k8s_namespace, resource_version=start_rv, timeout_seconds=30
            ):
                obj = ev["object"]
                if obj.metadata.name != "watched":
                    continue
                seen.append((ev["type"], obj.metadata.name, obj.data))
                if ev["type"] == "DELETED":
                    w.stop()
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    watcher = threading.Thread(target=run, daemon=True)
    watcher.start()
    _apply_cm(core, k8s_namespace, _cm("watched", {"v": "1"}), "zjusct-test")
    _apply_cm(core, k8s_namespace, _cm("watched", {"v": "2"}), "zjusct-test")
    core.delete_namespaced_config_map("watched", k8s_namespace)
    watcher.join(35)
    assert not errors, errors
    assert [(t, d) for t, _, d in seen] == [("ADDED", {"v": "1"}), ("MODIFIED", {"v": "2"}), ("DELETED", {"v": "2"})]
