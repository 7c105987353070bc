"""What the real kube-apiserver answers for a resource type it does not serve (a CRD not installed) and for one
absent object, and how the cloudvm and owner_quota modules read each (``k8s.client.api_missing``): the first is
the missing API, named with how to install it; the second is an absent object (a create may follow)."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import cloudvm, quota
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.k8s


def _raised(call: Any) -> ApiException:
    with pytest.raises(ApiException) as err:
        call()
    return err.value


@pytest.mark.parametrize("verb", ["list", "get"])
def test_a_resource_type_the_server_does_not_serve_is_the_missing_api(k8s_api: Any, k8s_namespace: str,
                                                                       verb: str) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    args = ("nosuch.cloud.zjusct.io", "v1alpha1", k8s_namespace, "cloudvms")
    exc = _raised(lambda: custom.list_namespaced_custom_object(*args) if verb == "list"
                  else custom.get_namespaced_custom_object(*args, "alice"))
    assert exc.status == 404
    err = cloudvm.api_error(exc, f"{verb} CloudVM")
    assert err.details["api_missing"] is True, (exc.body, str(err))
    assert "the CloudVM API is not installed on this cluster" in str(err)
    assert "site.yml -e zjusct_cloud_backend=kubernetes" in str(err)
    assert quota._api_error(exc, "get CloudQuota alice").details["api_missing"] is True


def test_an_absent_object_of_a_served_type_is_not_the_missing_api(k8s_api: Any, k8s_namespace: str,
                                                                  widget_crd: dict) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    exc = _raised(lambda: custom.get_namespaced_custom_object(widget_crd["group"], widget_crd["version"],
                                                              k8s_namespace, widget_crd["plural"], "absent"))
    assert exc.status == 404
    err = cloudvm.api_error(exc, "get CloudVM")
    assert err.details["api_missing"] is False and "not installed" not in str(err), str(err)
    assert err.details["api_reason"] == "NotFound"
