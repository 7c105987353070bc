"""The CloudVM API itself on the real kube-apiserver: config/crd/ is accepted, defaults are filled in,
and every schema / CEL rule refuses with its field path whichever client writes (here: the plain
Kubernetes client, as kubectl would)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests.integration.cloudvm_k8s.cloudvm_helpers import (
    GROUP,
    PLURAL,
    REPO,
    VERSION,
    CloudVMs,
    api_error,
    load_docs,
)

pytestmark = pytest.mark.k8s

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1qBq5mUL3Tj8Yo3Gc0wLkqj0ZC1S4Kk5uGq2pX3cQh alice@laptop"


def _causes(status: dict[str, Any]) -> list[str]:
    return [c.get("field", "") for c in (status.get("details") or {}).get("causes") or []]


def test_crd_is_served_with_short_name_printer_columns_and_status_subresource(k8s_api: Any,
                                                                              cloudvm_crd: dict[str, Any]) -> None:
    crd = client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition("cloudvms.cloud.zjusct.io")
    version = crd.spec.versions[0]
    assert crd.spec.names.short_names == ["cvm"]
    assert [c.name for c in version.additional_printer_columns] == [
        "Owner", "Phase", "BootID", "vCPUs", "Memory", "Node", "Reason", "Age"]
    assert version.subresources.status is not None
    found = DynamicClient(k8s_api).resources.get(api_version=f"{GROUP}/{VERSION}", short_names=["cvm"])
    assert found.kind == "CloudVM" and found.namespaced


def test_create_fills_defaults(cvm_api: CloudVMs, k8s_namespace: str) -> None:
    obj = cvm_api.create(k8s_namespace, "defaults")
    assert obj["spec"] == {"owner": "alice", "rootVolumeClaim": "defaults-root", "vcpus": 1, "memoryMiB": 512,
                           "powerState": "Stopped", "bootID": 0}


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        ({"vcpus": 0}, "spec.vcpus", "should be greater than or equal to 1"),
        ({"vcpus": 5}, "spec.vcpus", "should be less than or equal to 4"),
        ({"memoryMiB": 127}, "spec.memoryMiB", "should be greater than or equal to 128"),
        ({"memoryMiB": 4097}, "spec.memoryMiB", "should be less than or equal to 4096"),
        ({"powerState": "running"}, "spec.powerState", 'supported values: "Running", "Stopped"'),
        ({"bootID": -1}, "spec.bootID", "should be greater than or equal to 0"),
        ({"owner": "Alice"}, "spec.owner", "should match"),
        ({"rootVolumeClaim": "no_underscores"}, "spec.rootVolumeClaim", "should match"),
        ({"sshAuthorizedKeys": ["ssh-ed25519"]}, "spec.sshAuthorizedKeys[0]", "should match"),
        ({"sshAuthorizedKeys": ["ssh-dss AAAAB3NzaC1kc3MAAACBAP"]}, "spec.sshAuthorizedKeys[0]", "should match"),
        ({"sshAuthorizedKeys": [ED25519] * 17}, "spec.sshAuthorizedKeys", "must have at most 16 items"),
        ({"network": {"bandwidth": {"guaranteedMbps": 100, "ceilMbps": 50}}}, "spec.network.bandwidth.ceilMbps",
         "must be at least guaranteedMbps"),
        ({"network": {"bandwidth": {"priority": 1001}}}, "spec.network.bandwidth.priority",
         "should be less than or equal to 1000"),
    ],
    ids=["vcpus-0", "vcpus-5", "memory-127", "memory-4097", "powerState-running", "bootID-negative",
         "owner-not-dns-label", "claim-not-dns-subdomain", "ssh-key-without-blob", "ssh-key-unsupported-type",
         "too-many-ssh-keys",
         "ceil-below-guaranteed", "priority-1001"],
)
def test_invalid_spec_is_refused_with_field_path(cvm_api: CloudVMs, k8s_namespace: str, spec: dict[str, Any],
                                                 field: str, text: str) -> None:
    status = api_error(lambda: cvm_api.create(k8s_namespace, "bad", **spec))
    assert status["http_status"] == 422, status
    assert f"{field}:" in status["message"], status["message"]
    assert text in status["message"], status["message"]
    assert field in _causes(status), status
    assert cvm_api.get(k8s_namespace, "bad") is None


def test_name_must_be_a_dns_label(cvm_api: CloudVMs, k8s_namespace: str) -> None:
    status = api_error(lambda: cvm_api.create(k8s_namespace, "a.b"))
    assert "metadata.name" in status["message"], status["message"]


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"owner": "bob"}, "spec.owner", "is immutable (was alice, requested bob)"),
        ({"rootVolumeClaim": "other-root"}, "spec.rootVolumeClaim",
         "is immutable (was imm-root, requested other-root)"),
        ({"bootID": 2}, "spec.bootID", "must never decrease"),
    ],
    ids=["owner", "rootVolumeClaim", "bootID-decrease"],
)
def test_transition_rule_refuses_update_and_touches_nothing(cvm_api: CloudVMs, k8s_namespace: str,
                                                            change: dict[str, Any], field: str, text: str) -> None:
    before = cvm_api.create(k8s_namespace, "imm", bootID=3, vcpus=1)
    status = api_error(lambda: cvm_api.patch_spec(k8s_namespace, "imm", vcpus=2, **change))
    assert status["http_status"] == 422
    assert f"{field}: " in status["message"] and text in status["message"], status["message"]
    assert _causes(status) == [field], status
    after = cvm_api.get(k8s_namespace, "imm")
    assert after is not None
    assert after["spec"] == before["spec"]  # vcpus: 2 in the same request was not applied either
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_boot_id_may_grow_and_other_fields_change(cvm_api: CloudVMs, k8s_namespace: str) -> None:
    cvm_api.create(k8s_namespace, "grow", bootID=3)
    after = cvm_api.patch_spec(k8s_namespace, "grow", bootID=4, powerState="Running", vcpus=4, memoryMiB=4096)
    assert (after["spec"]["bootID"], after["spec"]["vcpus"], after["metadata"]["generation"]) == (4, 4, 2)


def test_status_is_written_only_through_the_status_subresource(cvm_api: CloudVMs, k8s_namespace: str) -> None:
    cvm_api.create(k8s_namespace, "st")
    patched = cvm_api.api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "st",
                                                         {"status": {"phase": "Running"}})
    assert "status" not in patched or patched["status"].get("phase") != "Running"
    written = cvm_api.set_status(k8s_namespace, "st", phase="Stopped", reason="NeverStarted", bootID=0,
                                 conditions=[{"type": "Ready", "status": "False", "reason": "NeverStarted",
                                              "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                                 sshEndpoint={"host": "10.200.0.2", "port": 22},
                                 exitResult={"reason": "GuestShutdown", "exitCode": 0,
                                             "finishedAt": "2026-01-01T00:00:00Z"})
    assert written["status"]["phase"] == "Stopped"
    assert written["metadata"]["generation"] == 1  # a status write is not a spec change
    bad = api_error(lambda: cvm_api.set_status(k8s_namespace, "st", phase="Booting"))
    assert "status.phase" in bad["message"], bad["message"]


def test_owner_is_a_selectable_field(cvm_api: CloudVMs, k8s_namespace: str) -> None:
    cvm_api.create(k8s_namespace, "mine")
    cvm_api.create(k8s_namespace, "theirs", owner="bob")
    got = cvm_api.api.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL,
                                                    field_selector="spec.owner=bob")
    assert [o["metadata"]["name"] for o in got["items"]] == ["theirs"]


@pytest.mark.parametrize("path", ["config/rbac/aggregate-roles.yaml", "config/rbac/controller-role.yaml",
                                  "config/rbac/tenant-example.yaml", "config/samples/cloudvm.yaml"])
def test_config_manifests_are_accepted_by_the_server(k8s_api: Any, cloudvm_crd: dict[str, Any], path: str) -> None:
    """Server-side dry run of every document (namespaced ones into an existing namespace)."""
    dyn = DynamicClient(k8s_api)
    for doc in load_docs(REPO / path):
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = None
        if res.namespaced:
            ns = "default"
            doc = dict(doc, metadata=dict(doc["metadata"], namespace=ns))
        try:
            res.create(body=doc, namespace=ns, dry_run="All")
        except Exception as exc:  # AlreadyExists is fine: the manifest was valid enough to reach storage checks
            assert getattr(exc, "status", None) == 409, f"{path} {doc['kind']}/{doc['metadata']['name']}: {exc}"
