"""The one lifecycle gives the same module results on both backends (docs/architecture.md, "One lifecycle, two
adapters"): the same ``cloudvm`` calls, table-driven, through the real host adapter (a private host store with a
real file volume) and the real Kubernetes adapter (the real kube-apiserver with the CRD and the owner policy, the
real controller writing the status), and their results compared field by field.

What is compared is what a caller reads: ``changed``, the refusal (its message and ``reason``), the warnings, the
diff, and the CloudVM's spec and labels. Server bookkeeping (uid, resourceVersion, timestamps) and a status the
controller may not have written yet when a call without ``wait`` returns are not. No guest boots: the calls stay
off the power path (tests/e2e/host and tests/integration/k8s_node boot guests on each backend).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import cloudvm_argument_spec, run_cloudvm
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import DNS_LABEL_RULE, OWNER_MARK
from ansible_collections.zjusct.cloud.plugins.module_utils.root_volume_info_module import (
    root_volume_info_argument_spec,
    run_root_volume_info,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import wait_for
from tests.integration.controller_process import Controller

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

KEY1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm1uC8Zg7yF3+Hx1b2s5Qw1z0r7kqJ9c9Jt1u0Ooq1A alice@one"
KEY2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3m7p5Yq3y9QdX6bqY8uYp0Hk9tV6eM1W2c4r8K2sJb alice@two"

# (what the call is, its options, check mode, diff); EXPECTED below says what each must give
CALLS: list[tuple[str, dict[str, Any], bool, bool]] = [
    ("create", {"owner": "alice", "vcpus": 2, "memory_mib": 256, "labels": {"tier": "web"},
                "ssh_authorized_keys": [KEY1]}, False, True),
    ("the same again", {"owner": "alice", "vcpus": 2, "memory_mib": 256, "labels": {"tier": "web"},
                        "ssh_authorized_keys": [KEY1]}, False, True),
    ("re-key and label", {"owner": "alice", "ssh_authorized_keys": [KEY2], "labels": {"course": "os"}}, False, True),
    ("resize, check mode", {"owner": "alice", "vcpus": 3}, True, True),
    ("another owner stops it", {"owner": "bob", "power_state": "stopped"}, False, False),
    ("another owner deletes it", {"owner": "bob", "state": "absent"}, False, False),
    ("stop the stopped VM", {"owner": "alice", "power_state": "stopped"}, False, False),
    ("an operator relabels it", {"owner": "ops", "operator": True, "labels": {"by": "ops"}}, False, False),
    ("delete, check mode", {"owner": "alice", "state": "absent"}, True, True),
    ("delete", {"owner": "alice", "state": "absent", "wait": True}, False, True),
    ("delete again", {"owner": "alice", "state": "absent", "wait": True}, False, False),
    ("no owner, no VM", {"power_state": "stopped"}, False, False),
]
# what each call gives, on both backends: changed (True/False) or the refusal's reason ("" when it has none)
EXPECTED = {"create": True, "the same again": False, "re-key and label": True, "resize, check mode": True,
            "another owner stops it": "Forbidden", "another owner deletes it": "Forbidden",
            "stop the stopped VM": False, "an operator relabels it": True, "delete, check mode": True,
            "delete": True, "delete again": False, "no owner, no VM": ""}


@pytest.fixture
def host_config(tmp_path: Path) -> str:
    """A private host store with one tiny image set (file volumes are copies of its 1 MiB rootfs)."""
    image = tmp_path / "images" / "tiny-1"
    image.mkdir(parents=True)
    (image / "rootfs.raw").write_bytes(b"\0" * (1024 * 1024))
    (image / "manifest.json").write_text(json.dumps({"name": "tiny", "builtAt": "2026-01-01T00:00:00Z"}))
    config = {"node": "lifecycle", "store_path": str(tmp_path / "cloud.db"), "images_dir": str(tmp_path / "images"),
              "default_image": "tiny", "volumes_dir": str(tmp_path / "volumes"), "state_dir": str(tmp_path / "state"),
              "runtime_dir": str(tmp_path / "run"), "log_dir": str(tmp_path / "log"), "netns": ""}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(config))
    return str(path)


def _call(backend: dict[str, Any], namespace: str, options: dict[str, Any], check: bool, diff: bool) -> dict:
    """One cloudvm module call in-process (the module's body), as a comparable outcome."""
    params = {k: v.get("default") for k, v in cloudvm_argument_spec().items()}
    params.update(backend, name="vm1", namespace=namespace, wait=False, wait_timeout=120)
    params.update(options)
    try:
        res = run_cloudvm(params, check, diff)
    except CloudError as exc:
        return {"failed": True, "msg": str(exc), "reason": exc.details.get("reason")}
    vm = res.get("cloudvm") or {}
    return {"changed": res["changed"], "warnings": res.get("warnings", []), "diff": res.get("diff"),
            "spec": vm.get("spec"), "labels": (vm.get("metadata") or {}).get("labels") or {}}


def test_the_same_calls_give_the_same_results_on_both_backends(
    controller: Controller, k8s_cluster: Any, k8s_namespace: str, host_config: str,
) -> None:
    kubernetes = {"backend": "kubernetes", "kubeconfig": str(k8s_cluster.kubeconfig)}
    host = {"backend": "host", "host_config": host_config}
    for what, options, check, diff in CALLS:
        on_host = _call(host, k8s_namespace, options, check, diff)
        on_k8s = _call(kubernetes, k8s_namespace, options, check, diff)
        assert on_host == on_k8s, f"{what}: host {on_host} != kubernetes {on_k8s}"
        got = (on_host.get("reason") or "") if on_host.get("failed") else on_host["changed"]
        assert got == EXPECTED[what], f"{what}: {on_host}"
        if what == "re-key and label":
            assert on_host["spec"]["sshAuthorizedKeys"] == [KEY2] and on_host["spec"]["vcpus"] == 2
            assert on_host["labels"] == {"tier": "web", "course": "os"}
            assert on_host["diff"]["before"]["sshAuthorizedKeys"] == [KEY1]
        if what == "resize, check mode":
            assert on_host["spec"]["vcpus"] == 3
        if what == "stop the stopped VM":
            assert on_host["spec"]["vcpus"] == 2, "the check-mode resize must not have been written"
    # and what they did is what they said: the Forbidden and check-mode calls wrote nothing, the VM is gone
    assert _call(host, k8s_namespace, {"owner": "alice", "state": "absent"}, False, False)["changed"] is False


def _root_volume(backend: dict[str, Any], namespace: str, **options: Any) -> dict:
    """One root_volume_info call in-process (the module's body); a refusal as ``{"failed", "msg"}``."""
    params = {k: v.get("default") for k, v in root_volume_info_argument_spec().items()}
    params.update(backend, namespace=namespace, **options)
    try:
        return run_root_volume_info(params, False)
    except CloudError as exc:
        return {"failed": True, "msg": str(exc)}


def test_root_volume_info_describes_a_root_volume_in_one_shape_on_both_backends(
    k8s_cluster: Any, k8s_api: Any, k8s_namespace: str, host_config: str,
) -> None:
    """The backup and restore playbooks read a VM's root volume through root_volume_info on both backends: the host
    store's record (made by a real create) and a claim bound to an RBD PersistentVolume on the real API server."""
    ns, core = k8s_namespace, client.CoreV1Api(k8s_api)
    kubernetes = {"backend": "kubernetes", "kubeconfig": str(k8s_cluster.kubeconfig)}
    host = {"backend": "host", "host_config": host_config}
    for backend in (host, kubernetes):  # nothing yet: no volume, and why
        got = _root_volume(backend, ns, vm="vm1")
        assert (got["name"], got["volume"]) == ("vm1-root", None) and "vm1-root" in got["missing"], got
    assert _root_volume(kubernetes, ns, vm="vm1")["missing"] == f"no PersistentVolumeClaim {ns}/vm1-root"

    made = _call(host, ns, {"owner": "alice"}, False, False)
    assert made["changed"] is True, made
    pv_name = f"{ns}.vm1-root"
    labels = {OWNER_MARK: "alice"}
    core.create_namespaced_persistent_volume_claim(ns, {
        "metadata": {"name": "vm1-root", "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "",
                 "resources": {"requests": {"storage": "1Mi"}}}})
    unbound = _root_volume(kubernetes, ns, name="vm1-root")
    assert unbound["volume"] is None and "names no PersistentVolume (spec.volumeName)" in unbound["missing"]
    core.patch_namespaced_persistent_volume_claim("vm1-root", ns, {"spec": {"volumeName": pv_name}})
    assert "does not exist" in _root_volume(kubernetes, ns, name="vm1-root")["missing"]

    def make_pv(claim: str, driver: str) -> str:
        name = f"{ns}.{claim}"
        core.create_persistent_volume({
            "metadata": {"name": name, "labels": labels},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "claimRef": {"namespace": ns, "name": claim},
                     "csi": {"driver": driver, "volumeHandle": f"rbd/{name}",
                             "volumeAttributes": {"pool": "rbd", "imageName": name}}}})
        return name

    def bound(claim: str) -> None:  # the PV controller of kube-controller-manager binds a pre-bound pair
        wait_for(lambda: core.read_namespaced_persistent_volume_claim(claim, ns).status.phase == "Bound", 120,
                 f"PersistentVolumeClaim {claim} Bound")

    pvs = [make_pv("vm1-root", "rbd.csi.ceph.com")]
    bound("vm1-root")
    try:
        on_host, on_k8s = _root_volume(host, ns, vm="vm1"), _root_volume(kubernetes, ns, vm="vm1")
        common = ("name", "owner", "claimed_by")
        assert {k: on_host["volume"][k] for k in common} == {k: on_k8s["volume"][k] for k in common} == {
            "name": "vm1-root", "owner": "alice", "claimed_by": None}, (on_host, on_k8s)
        assert (on_host["volume"]["driver"], on_host["volume_driver"], on_host["rbd_image"]) == ("file", "file", None)
        assert on_host["host_config"] == host_config and on_host["missing"] == ""
        assert (on_k8s["volume"]["driver"], on_k8s["volume_driver"], on_k8s["rbd_image"]) == ("rbd", "rbd", pv_name)
        assert on_k8s["volume"]["rbd"] == {"pool": "rbd", "image": pv_name} and on_k8s["host_config"] is None
        assert on_k8s["volume"]["persistent_volume"] == pv_name and on_k8s["missing"] == ""
        # a claim naming that PV (anyone may create one in their namespace) is not given its image
        core.create_namespaced_persistent_volume_claim(ns, {
            "metadata": {"name": "thief-root"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "",
                     "volumeName": pv_name, "resources": {"requests": {"storage": "1Mi"}}}})
        thief = _root_volume(kubernetes, ns, name="thief-root")
        assert thief["volume"] is None and f"spec.claimRef is {ns}/vm1-root, not" in thief["missing"], thief
        # another CSI driver is named as the driver (the backup playbook refuses it, naming it)
        core.create_namespaced_persistent_volume_claim(ns, {
            "metadata": {"name": "other-root", "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "",
                     "volumeName": f"{ns}.other-root", "resources": {"requests": {"storage": "1Mi"}}}})
        pvs.append(make_pv("other-root", "other.csi.example"))
        bound("other-root")
        assert _root_volume(kubernetes, ns, name="other-root")["volume"]["driver"] == "other.csi.example"
    finally:
        for name in pvs:
            with contextlib.suppress(ApiException):
                core.delete_persistent_volume(name)
    for backend in (host, kubernetes):  # bad input names the option and the rule
        assert _root_volume(backend, ns, vm="Web_1") == {
            "failed": True, "msg": f"vm: 'Web_1' is not a DNS label ({DNS_LABEL_RULE}); a CloudVM name such as web"}


def test_a_root_volume_grows_on_both_backends_and_never_shrinks(
    controller: Controller, k8s_cluster: Any, k8s_namespace: str, host_config: str,
) -> None:
    """volume_size_mib on an existing VM writes spec.rootVolumeSizeMiB on both backends (the launcher grows the disk
    at the next boot); a smaller one is refused by both - the host's validate_update, the API server's CEL rule
    ``self >= oldSelf`` - naming the variable and the field. The host's volume record takes the new size."""
    kubernetes = {"backend": "kubernetes", "kubeconfig": str(k8s_cluster.kubeconfig)}
    host = {"backend": "host", "host_config": host_config}
    for backend in (host, kubernetes):
        assert _call(backend, k8s_namespace, {"owner": "alice"}, False, False)["changed"] is True
        grown = _call(backend, k8s_namespace, {"owner": "alice", "volume_size_mib": 8}, False, True)
        assert grown["changed"] is True and grown["spec"]["rootVolumeSizeMiB"] == 8, grown
        assert grown["diff"]["after"]["rootVolumeSizeMiB"] == 8, grown
        shrunk = _call(backend, k8s_namespace, {"owner": "alice", "volume_size_mib": 6}, False, False)
        assert shrunk["failed"] and "volume_size_mib (spec.rootVolumeSizeMiB;" in shrunk["msg"], shrunk
        assert "must never decrease" in shrunk["msg"], shrunk
    params = {k: v.get("default") for k, v in root_volume_info_argument_spec().items()}
    record = run_root_volume_info(dict(params, backend="host", host_config=host_config, vm="vm1"), False)["volume"]
    assert record["size_mib"] == 8, record
