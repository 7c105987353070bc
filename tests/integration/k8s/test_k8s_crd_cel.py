"""CRD validation is done by the real API server: OpenAPI schema and CEL rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.k8s


def _widget(name: str, owner: str = "alice", min_replicas: int = 1, max_replicas: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "test.zjusct.io/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"owner": owner, "minReplicas": min_replicas, "maxReplicas": max_replicas},
    }


def _create(api: Any, crd: dict[str, str], ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            crd["group"], crd["version"], ns, crd["plural"], body
        )
    )


def test_valid_object_is_accepted(k8s_api: Any, widget_crd: dict[str, str], k8s_namespace: str) -> None:
    obj = _create(k8s_api, widget_crd, k8s_namespace, _widget("ok"))
    assert obj["spec"]["maxReplicas"] == 3
    assert obj["metadata"]["generation"] == 1


def test_cel_rule_rejects_with_its_message(k8s_api: Any, widget_crd: dict[str, str], k8s_namespace: str) -> None:
    with pytest.raises(ApiException) as err:
        _create(k8s_api, widget_crd, k8s_namespace, _widget("bad", min_replicas=5, max_replicas=2))
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    assert "minReplicas must not exceed maxReplicas" in status["message"]
    # fieldPath in the rule names the field in the structured cause
    fields = [c.get("field") for c in status["details"]["causes"]]
    assert "spec.minReplicas" in fields, status


def test_cel_transition_rule_makes_field_immutable(
    k8s_api: Any, widget_crd: dict[str, str], k8s_namespace: str
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    g, v, p = widget_crd["group"], widget_crd["version"], widget_crd["plural"]
    _create(k8s_api, widget_crd, k8s_namespace, _widget("immut", owner="alice"))
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(g, v, k8s_namespace, p, "immut", {"spec": {"owner": "mallory"}})
    assert err.value.status == 422
    assert "owner is immutable" in json.loads(err.value.body)["message"]
    # other fields stay mutable
    obj = custom.patch_namespaced_custom_object(g, v, k8s_namespace, p, "immut", {"spec": {"maxReplicas": 4}})
    assert obj["spec"]["maxReplicas"] == 4


def test_openapi_schema_rejects_wrong_type(k8s_api: Any, widget_crd: dict[str, str], k8s_namespace: str) -> None:
    body = _widget("typed")
    body["spec"]["maxReplicas"] = "many"
    with pytest.raises(ApiException) as err:
        _create(k8s_api, widget_crd, k8s_namespace, body)
    assert err.value.status == 422
    assert "spec.maxReplicas" in json.loads(err.value.body)["message"]
