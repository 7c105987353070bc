"""The audit story on Kubernetes (docs/security.md, "Audit (Kubernetes)"), on the real kube-apiserver:

* its audit log, written with the collection's policy (config/audit/policy.yaml, wired into the control plane by
  localcluster/zjusct_localcluster/controlplane.py), records a tenant's CloudVM writes with the tenant's name, the
  verb and the request body, refusals with their 403, Secrets without any body, and no reads;
* volume_backup's ``event`` option records a backup and a restore of a real file volume as Events of the CloudVM,
  written with the tenant's own client certificate (so the audit log names her as their author); a failed backup
  is a Warning Event and still fails; check mode writes none; a user who may not create Events is refused before
  anything is backed up.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import BLOCK_SIZE, BackupError
from ansible_collections.zjusct.cloud.plugins.module_utils.volume_backup_module import (
    run_volume_backup,
    volume_backup_argument_spec,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import CONTROL_PLANE_WAIT, TENANT_NAMESPACE, TENANT_USER, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import GROUP, PLURAL, VERSION, CloudVMs, api_error

pytestmark = pytest.mark.k8s

MiB = 1024 * 1024


def audit_entries(cluster: Any) -> list[dict[str, Any]]:
    """Every audit event kube-apiserver has written so far (rotated files too)."""
    out = []
    for path in sorted(cluster.audit_log.parent.glob("audit*.log")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def entries_for(cluster: Any, resource: str, name: str | None, **match: Any) -> list[dict[str, Any]]:
    """Audit events of ``resource``/``name`` (None: no name, e.g. a create with generateName) whose top-level
    fields equal ``match`` (``verb="create"``...)."""
    return [e for e in audit_entries(cluster)
            if (e.get("objectRef") or {}).get("resource") == resource and (e.get("objectRef") or {}).get("name") == name
            and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture
def tenant_vm(tenant_api: Any, cvm_api: CloudVMs) -> Iterator[tuple[str, dict[str, Any]]]:
    """A CloudVM of alice in her namespace, created with her own certificate; a new name each test."""
    name = f"audit-{uuid.uuid4().hex[:8]}"
    vm = CloudVMs(client.CustomObjectsApi(tenant_api)).create(TENANT_NAMESPACE, name, owner=TENANT_USER)
    yield name, vm
    with contextlib.suppress(ApiException):
        cvm_api.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, name)


def test_audit_log_records_who_wrote_a_cloudvm_but_no_secret_body_and_no_read(
        k8s_cluster: Any, tenant_api: Any, cvm_api: CloudVMs, tenant_vm: tuple[str, dict[str, Any]]) -> None:
    name, _vm = tenant_vm
    tenant = CloudVMs(client.CustomObjectsApi(tenant_api))
    created = wait_for(lambda: entries_for(k8s_cluster, "cloudvms", name, verb="create"), CONTROL_PLANE_WAIT,
                       f"the audit event of alice's create of CloudVM {name}")
    (entry,) = created
    assert entry["user"]["username"] == TENANT_USER
    assert entry["level"] == "Request" and entry["stage"] == "ResponseComplete"
    assert entry["objectRef"]["namespace"] == TENANT_NAMESPACE and entry["objectRef"]["apiGroup"] == GROUP
    assert entry["requestObject"]["spec"]["owner"] == TENANT_USER  # the body: what was asked
    assert entry["responseStatus"]["code"] == 201 and "responseObject" not in entry

    # a refusal (the owner admission policy) is on record with its 403 and the name of who tried
    refused = f"{name}-bob"
    assert api_error(lambda: tenant.create(TENANT_NAMESPACE, refused, owner="bob"))["http_status"] == 403
    (denied,) = wait_for(lambda: entries_for(k8s_cluster, "cloudvms", refused, verb="create"), CONTROL_PLANE_WAIT,
                         f"the audit event of the refused create of {refused}")
    assert denied["user"]["username"] == TENANT_USER and denied["responseStatus"]["code"] == 403

    # a Secret: who and which one, never its data
    core: Any = client.CoreV1Api(tenant_api)
    secret, value = f"{name}-key", f"s3cret-{uuid.uuid4().hex}"
    core.create_namespaced_secret(TENANT_NAMESPACE, {"metadata": {"name": secret}, "stringData": {"key": value}})
    try:
        (wrote,) = wait_for(lambda: entries_for(k8s_cluster, "secrets", secret, verb="create"), CONTROL_PLANE_WAIT,
                            f"the audit event of Secret {secret}'s create")
        assert wrote["level"] == "Metadata" and wrote["user"]["username"] == TENANT_USER
        assert "requestObject" not in wrote and "responseObject" not in wrote
        assert value not in k8s_cluster.audit_log.read_text()
    finally:
        core.delete_namespaced_secret(secret, TENANT_NAMESPACE)

    # reads are not logged: a get before a delete leaves only the delete
    assert tenant.get(TENANT_NAMESPACE, name) is not None
    tenant.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, name)
    (deleted,) = wait_for(lambda: entries_for(k8s_cluster, "cloudvms", name, verb="delete"), CONTROL_PLANE_WAIT,
                          f"the audit event of CloudVM {name}'s delete")
    assert deleted["user"]["username"] == TENANT_USER
    assert {e["verb"] for e in entries_for(k8s_cluster, "cloudvms", name)} == {"create", "delete"}


# --------------------------------------------------------------------------- backups as Events


def volume_file(tmp_path: Path) -> Path:
    """A 12 MiB raw file volume with data in its second block."""
    vol = tmp_path / "alice-root.raw"
    with open(vol, "wb") as f:
        f.truncate(12 * MiB)
        f.seek(BLOCK_SIZE)
        f.write(b"alice's data" * 1000)
    return vol


def params(**kw: Any) -> dict[str, Any]:
    """The module's parameters with its defaults, as AnsibleModule hands them over."""
    out = {k: v.get("default") for k, v in volume_backup_argument_spec().items()}
    out.update(timeout=120.0, **kw)
    return out


def vm_events(api: Any, name: str) -> list[Any]:
    """The Events about CloudVM ``name`` in the tenant's namespace (what kubectl get events lists)."""
    got = client.CoreV1Api(api).list_namespaced_event(TENANT_NAMESPACE, field_selector=f"involvedObject.name={name}")
    return list(got.items)


def test_a_backup_and_a_restore_are_events_of_the_cloudvm_written_as_the_tenant(
        k8s_cluster: Any, tenant_api: Any, tenant_vm: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    name, vm = tenant_vm
    vol, dest = volume_file(tmp_path), str(tmp_path / "bk")
    common = dict(dest=dest, owner=TENANT_USER, actor=TENANT_USER, vm=f"{TENANT_NAMESPACE}/{name}",
                  event={"namespace": TENANT_NAMESPACE, "cloudvm": name}, kubeconfig=str(k8s_cluster.tenant_kubeconfig))

    planned = run_volume_backup(params(path=str(vol), driver="file", **common), True)
    assert planned["type"] == "full" and "event" not in planned and not os.path.exists(dest)
    done = run_volume_backup(params(path=str(vol), driver="file", **common), False)
    assert done["event"]["reason"] == "BackupCompleted" and done["event"]["namespace"] == TENANT_NAMESPACE

    (event,) = vm_events(tenant_api, name)  # only one: check mode wrote none
    assert event.metadata.name == done["event"]["name"]
    assert (event.type, event.reason, event.action) == ("Normal", "BackupCompleted", "Backup")
    ref = event.involved_object
    assert (ref.kind, ref.api_version, ref.name, ref.namespace, ref.uid) == (
        "CloudVM", f"{GROUP}/{VERSION}", name, TENANT_NAMESPACE, vm["metadata"]["uid"])
    assert event.message == (f"backup {done['backup_id']} (full) of file:{vol} into {dest} by {TENANT_USER} for "
                             f"owner {TENANT_USER}")
    assert event.reporting_component == "zjusct.cloud" and event.source.component == "zjusct.cloud"
    assert event.metadata.labels == {"cloud.zjusct.io/owner": TENANT_USER,
                                     "cloud.zjusct.io/backup-id": done["backup_id"]}
    assert event.metadata.annotations["cloud.zjusct.io/actor"] == TENANT_USER
    # written with alice's own credentials: the API server's audit log names her as the Event's author (a create
    # with generateName has no name in its objectRef; the request body has the rest)
    (wrote,) = wait_for(lambda: [e for e in entries_for(k8s_cluster, "events", None, verb="create")
                                 if e["requestObject"]["involvedObject"]["name"] == name],
                        CONTROL_PLANE_WAIT, f"the audit event of the create of Event {event.metadata.name}")
    assert wrote["user"]["username"] == TENANT_USER and wrote["requestObject"]["reason"] == "BackupCompleted"
    assert wrote["responseStatus"]["code"] == 201 and wrote["objectRef"]["namespace"] == TENANT_NAMESPACE

    restored = run_volume_backup(params(state="restored", backup_id=done["backup_id"],
                                        target_path=str(tmp_path / "restored.raw"), **common), False)
    assert restored["event"]["reason"] == "RestoreCompleted"
    events = {e.reason: e for e in vm_events(tenant_api, name)}  # the same second: order them by reason
    assert sorted(events) == ["BackupCompleted", "RestoreCompleted"]
    restore = events["RestoreCompleted"]
    assert (restore.type, restore.reason, restore.action) == ("Normal", "RestoreCompleted", "Restore")
    assert restore.message == (f"backup {done['backup_id']} restored into file:{tmp_path / 'restored.raw'} by "
                               f"{TENANT_USER} for owner {TENANT_USER}")
    assert (tmp_path / "restored.raw").read_bytes() == vol.read_bytes()


def test_a_failed_backup_is_a_warning_event_and_still_fails(
        k8s_cluster: Any, tenant_api: Any, tenant_vm: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    name, _vm = tenant_vm
    missing, dest = tmp_path / "no-such-volume.raw", str(tmp_path / "bk")
    with pytest.raises(BackupError) as err:
        run_volume_backup(params(path=str(missing), driver="file", dest=dest, owner=TENANT_USER, actor="carol",
                                 event={"namespace": TENANT_NAMESPACE, "cloudvm": name},
                                 kubeconfig=str(k8s_cluster.tenant_kubeconfig)), False)
    (event,) = vm_events(tenant_api, name)
    assert (event.type, event.reason, event.action) == ("Warning", "BackupFailed", "Backup")
    assert event.message.startswith(f"backup of file:{missing} into {dest} by carol for owner {TENANT_USER} "
                                    "failed: ")
    assert str(err.value)[:200] in event.message
    assert event.metadata.annotations["cloud.zjusct.io/actor"] == "carol"


def test_a_user_who_may_not_create_events_is_refused_before_any_backup(
        k8s_cluster: Any, k8s_api: Any, tenant_api: Any, tenant_vm: tuple[str, dict[str, Any]],
        tmp_path: Path) -> None:
    name, _vm = tenant_vm
    rbac: Any = client.RbacAuthorizationV1Api(k8s_api)
    binding = f"{name}-viewer"
    viewer = f"viewer-{name}"
    rbac.create_namespaced_role_binding(TENANT_NAMESPACE, {
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": viewer}]})
    try:
        dest = tmp_path / "bk"
        with pytest.raises(CloudError, match=f"may not create Events in namespace {TENANT_NAMESPACE}") as err:
            run_volume_backup(params(path=str(volume_file(tmp_path)), driver="file", dest=str(dest),
                                     owner=TENANT_USER, event={"namespace": TENANT_NAMESPACE, "cloudvm": name},
                                     kubeconfig=str(k8s_cluster.kubeconfig), impersonate_user=viewer), False)
        assert err.value.failure() == {"field": "event", "reason": "Forbidden"}
        assert not dest.exists()  # nothing was backed up
        assert vm_events(tenant_api, name) == []
    finally:
        rbac.delete_namespaced_role_binding(binding, TENANT_NAMESPACE)
