"""zjusct.cloud.root_volume_claim and the vm_* playbooks on Kubernetes with RBD root volumes.

Real components: the shared test control plane (kube-apiserver and kube-controller-manager, whose PV controller
binds the claim) and the session's real Ceph cluster; no controller runs, so nothing here waits for a phase (the
journey through a running guest is tests/integration/k8s_node/test_journey_kubernetes.py). The image set is a
small real one made per test (a manifest and an 8 MiB ``rootfs.raw`` with a marker), so the template
``tmpl-<set>@base`` and its clones are real RBD images.
"""
# ruff: noqa: F811  (pytest fixtures take the imported fixtures as parameters of the same name)

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.root_volume_info_module import (
    root_volume_info_argument_spec,
    run_root_volume_info,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import META_OWNER, ImageRef, Rbd, RbdError
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.ceph import Cluster as CephCluster
from tests.cluster import wait_for
from tests.e2e.playbook_results import failure, task_result
from tests.integration.ceph.conftest import ceph_cluster, rbd, read_image, write_at  # noqa: F401
from tests.integration.cloudvm_k8s.cloudvm_helpers import REPO, VENV_BIN, CloudVMs, PlayRun

pytestmark = [pytest.mark.k8s, pytest.mark.ceph, pytest.mark.timeout(900)]
OWNER_LABEL = "cloud.zjusct.io/owner"
MiB = 1 << 20
MARKER = b"zjusct-root-volume-marker"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl unused"


def _remove(rbd: Rbd, ref: ImageRef) -> None:
    with contextlib.suppress(RbdError):
        rbd.snap_purge(ref)
    with contextlib.suppress(RbdError):
        rbd.remove(ref)


@pytest.fixture
def image_set(tmp_path: Path, rbd: Rbd, k8s_namespace: str) -> Iterator[Path]:
    """A complete image set ``<tmp>/images/tiny-<hex>`` (manifest, 8 MiB rootfs.raw with MARKER at 1 MiB).

    Afterwards the images of the test's namespace (``<namespace>.*``), every clone of the set's template and the
    template are removed from the pool."""
    d = tmp_path / "images" / f"tiny-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"name": d.name, "version": "1", "builtAt": "2026-12-01T00:00:00Z"}))
    with open(d / "rootfs.raw", "wb") as f:
        f.truncate(8 * MiB)
        f.seek(MiB)
        f.write(MARKER)
    yield d
    for name in rbd.run(["ls", "rbd"]) or []:
        if str(name).startswith(f"{k8s_namespace}."):
            _remove(rbd, ImageRef("rbd", str(name)))
    template = ImageRef("rbd", f"tmpl-{d.name}")
    with contextlib.suppress(RbdError):
        for child in rbd.children(template.at("base"), include_trash=True):
            _remove(rbd, ImageRef(child["pool"], child["image"]))
    with contextlib.suppress(RbdError):
        rbd.snap_unprotect(template.at("base"))
    _remove(rbd, template)


@pytest.fixture
def core(k8s_api: Any) -> Any:
    return client.CoreV1Api(k8s_api)


@pytest.fixture
def pvs(core: Any) -> Iterator[list[str]]:
    """PersistentVolume names a test made (cluster-scoped: deleted afterwards)."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(name)


def ceph_env(cluster: CephCluster) -> dict[str, str]:
    """The ceph doc fragment's environment fallbacks (client.admin of the test cluster)."""
    return {"CEPH_CONF": str(cluster.conf), "CEPH_KEYRING": str(cluster.keyring)}


def claim_task(ns: str, name: str, owner: str, images: Path | None, image: str | None, **extra: Any) -> dict:
    args = {"name": name, "namespace": ns, "owner": owner, "wait_timeout": 120, **extra}
    if image is not None and images is not None:
        args.update(image=image, images_dir=str(images))
    return {"zjusct.cloud.root_volume_claim": args}


def exists_pv(core: Any, name: str) -> bool:
    try:
        core.read_persistent_volume(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def exists_pvc(core: Any, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_persistent_volume_claim(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _web_root(ns: str, pvs: list[str]) -> tuple[str, str, str, ImageRef]:
    """The claim ``web-root`` in ``ns``: (namespace, claim, PV name, RBD image); the PV is deleted at teardown."""
    pv_name = f"{ns}.web-root"
    pvs.append(pv_name)
    return ns, "web-root", pv_name, ImageRef("rbd", pv_name)


def test_creates_clone_pv_and_bound_claim_once_and_check_mode_creates_nothing(
    play: Callable[..., PlayRun], ceph_cluster: CephCluster, rbd: Rbd, core: Any, k8s_namespace: str,
    image_set: Path, pvs: list[str],
) -> None:
    ns, claim, pv_name, ref = _web_root(k8s_namespace, pvs)
    task = claim_task(ns, claim, "alice", image_set.parent, image_set.name)
    env = ceph_env(ceph_cluster)

    dry = play([task], check=True, diff=True, env=env).results[0]
    assert not dry.get("failed"), dry
    assert dry["changed"] is True
    assert dry["actions"] == [f"import template rbd/tmpl-{image_set.name}@base",
                              f"clone rbd/tmpl-{image_set.name}@base {ref.spec}",
                              f"set image-meta {META_OWNER} alice", f"create PersistentVolume {pv_name}",
                              f"create PersistentVolumeClaim {ns}/{claim}"]
    assert rbd.info(ref) is None and rbd.info(ImageRef("rbd", f"tmpl-{image_set.name}")) is None
    assert not exists_pv(core, pv_name) and not exists_pvc(core, ns, claim)

    first = play([task], env=env).results[0]
    assert not first.get("failed"), first
    assert first["changed"] is True
    assert first["claim"] == {"namespace": ns, "name": claim, "phase": "Bound", "used_by": None}
    assert first["rbd_image"] == {"pool": "rbd", "name": pv_name, "size_mib": 8, "owner": "alice"}
    info = rbd.info(ref)
    assert info is not None
    assert info["parent"]["image"] == f"tmpl-{image_set.name}" and info["parent"]["snapshot"] == "base"
    assert rbd.meta(ref)[META_OWNER] == "alice"
    assert MARKER in read_image(ceph_cluster, ref, str(image_set.parent / "export.raw"))[MiB:MiB + 64]
    pv = core.read_persistent_volume(pv_name)
    assert pv.metadata.labels[OWNER_LABEL] == "alice"
    assert (pv.spec.claim_ref.namespace, pv.spec.claim_ref.name) == (ns, claim)
    assert (pv.spec.csi.driver, pv.spec.csi.volume_handle) == ("rbd.csi.ceph.com", ref.spec)
    assert pv.spec.csi.volume_attributes == {"pool": "rbd", "imageName": pv_name}
    assert (pv.spec.volume_mode, pv.spec.persistent_volume_reclaim_policy) == ("Block", "Retain")
    assert not pv.spec.storage_class_name  # "" (the API server omits it)
    pvc = core.read_namespaced_persistent_volume_claim(claim, ns)
    assert pvc.metadata.labels[OWNER_LABEL] == "alice"
    assert (pvc.spec.volume_name, pvc.spec.volume_mode, pvc.status.phase) == (pv_name, "Block", "Bound")

    again = play([task], env=env).results[0]
    assert not again.get("failed"), again
    assert (again["changed"], again["actions"]) == (False, [])


def _other_image(rbd: Rbd, ref: ImageRef, owner: str | None) -> None:
    rbd.create(ref, 4)
    if owner:
        rbd.meta_set(ref, META_OWNER, owner)


@pytest.mark.parametrize("case", ["image-owner", "pv-owner", "pv-claim", "pvc-owner", "pvc-volume"])
def test_refuses_an_object_of_someone_else_naming_it_and_creates_nothing(
    case: str, play: Callable[..., PlayRun], ceph_cluster: CephCluster, rbd: Rbd, core: Any, k8s_namespace: str,
    image_set: Path, pvs: list[str],
) -> None:
    ns, claim, pv_name, ref = _web_root(k8s_namespace, pvs)
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name, "labels": {OWNER_LABEL: "bob"}},
          "spec": {"capacity": {"storage": "4Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                   "volumeMode": "Block", "persistentVolumeReclaimPolicy": "Retain",
                   "claimRef": {"namespace": ns, "name": claim},
                   "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": ref.spec,
                           "volumeAttributes": {"pool": "rbd", "imageName": pv_name}}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": claim, "labels": {OWNER_LABEL: "bob"}},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": "Block",
                    "volumeName": pv_name, "resources": {"requests": {"storage": "4Mi"}}}}
    if case == "image-owner":
        _other_image(rbd, ref, "bob")
        want = f"RBD image {ref.spec}: image-meta {META_OWNER} is bob, not alice"
    elif case == "pv-owner":
        _other_image(rbd, ref, "alice")
        core.create_persistent_volume(pv)
        want = f"PersistentVolume {pv_name}: metadata.labels[{OWNER_LABEL}] is bob, not alice"
    elif case == "pv-claim":
        _other_image(rbd, ref, "alice")
        pv["metadata"]["labels"][OWNER_LABEL] = "alice"
        pv["spec"]["claimRef"] = {"namespace": ns, "name": "other-root"}
        core.create_persistent_volume(pv)
        want = f"PersistentVolume {pv_name}: spec.claimRef is {ns}/other-root, not {ns}/{claim}"
    elif case == "pvc-owner":
        core.create_namespaced_persistent_volume_claim(ns, pvc)
        want = f"PersistentVolumeClaim {ns}/{claim}: metadata.labels[{OWNER_LABEL}] is bob, not alice"
    else:
        pvc["metadata"]["labels"][OWNER_LABEL] = "alice"
        pvc["spec"]["volumeName"] = "someone-elses-pv"
        core.create_namespaced_persistent_volume_claim(ns, pvc)
        want = f"PersistentVolumeClaim {ns}/{claim}: spec.volumeName is someone-elses-pv, not {pv_name}"
    had_image, had_pv, had_pvc = rbd.info(ref) is not None, exists_pv(core, pv_name), exists_pvc(core, ns, claim)

    got = play([claim_task(ns, claim, "alice", image_set.parent, image_set.name)], env=ceph_env(ceph_cluster))
    res = got.results[0]
    assert res.get("failed"), res
    assert want in res["msg"], res["msg"]
    # nothing was created: no template import, no clone, no PV, no claim beyond what the test made
    assert rbd.info(ImageRef("rbd", f"tmpl-{image_set.name}")) is None
    assert (rbd.info(ref) is not None, exists_pv(core, pv_name), exists_pvc(core, ns, claim)) == (
        had_image, had_pv, had_pvc)
    if had_image:
        assert rbd.meta(ref).get(META_OWNER) == ("bob" if case == "image-owner" else "alice")


# --------------------------------------------------------------------------- the playbooks


def run_playbook(playbook: str, extra: dict[str, Any], env: dict[str, str], tmp_path: Path,
                 check: bool = False) -> tuple[int, dict]:
    """``ansible-playbook playbooks/<playbook> -e <json>`` with the ansible.posix.json callback."""
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}", "-e", json.dumps(extra),
            str(REPO / "playbooks" / playbook)]
    if check:
        argv.append("--check")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("K8S_AUTH_", "CEPH_", "ZJUSCT_CLOUD_"))}
    full.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), **env)
    out = subprocess.run(argv, cwd=REPO, env=full, capture_output=True, text=True, timeout=600, check=False)
    try:
        doc = json.loads(out.stdout[out.stdout.index("{"):])
    except ValueError as exc:
        raise AssertionError(f"no JSON from ansible-playbook (rc {out.returncode}):\n{out.stdout}\n{out.stderr}"
                             ) from exc
    doc["raw"], doc["stderr"] = out.stdout, out.stderr
    return out.returncode, doc


@pytest.fixture
def k8s_env(k8s_cluster: Any, cloudvm_crd: dict[str, Any], ceph_cluster: CephCluster) -> dict[str, str]:
    """What a playbook host needs for the Kubernetes backend: the backend switch, the kubeconfig, Ceph's env."""
    return {"ZJUSCT_CLOUD_BACKEND": "kubernetes", "K8S_AUTH_KUBECONFIG": str(k8s_cluster.kubeconfigs["admin"]),
            **ceph_env(ceph_cluster)}


def test_vm_start_in_check_mode_creates_nothing_and_vm_delete_keeps_the_volume(
    k8s_env: dict[str, str], cvm_api: CloudVMs, ceph_cluster: CephCluster, rbd: Rbd, core: Any,
    k8s_namespace: str, image_set: Path, pvs: list[str], tmp_path: Path, play: Callable[..., PlayRun],
) -> None:
    """vm_start's volume step in check mode, and vm_delete on Kubernetes. What vm_start does for real (volume, VM,
    Running once SSH answers, and again on the kept volume after vm_delete) needs the controller and a node:
    tests/integration/k8s_node/test_journey_kubernetes.py."""
    ns = k8s_namespace
    pv_name = f"{ns}.web-root"
    pvs.append(pv_name)
    ref = ImageRef("rbd", pv_name)
    extra = {"owner": "alice", "name": "web", "vm_namespace": ns, "image": image_set.name,
             "images_dir": str(image_set.parent), "ssh_public_key": PUBKEY, "wait_timeout": 120}

    rc, doc = run_playbook("vm_start.yml", extra, k8s_env, tmp_path, check=True)
    assert rc == 0, failure(doc)
    assert rbd.info(ref) is None and not exists_pv(core, pv_name) and not exists_pvc(core, ns, "web-root")
    assert cvm_api.get(ns, "web") is None

    made = play([claim_task(ns, "web-root", "alice", image_set.parent, image_set.name)],
                env=ceph_env(ceph_cluster)).results[0]
    assert not made.get("failed"), made
    cvm_api.create(ns, "web", powerState="Stopped", bootID=0)

    rc, doc = run_playbook("vm_delete.yml", {"owner": "alice", "name": "web", "vm_namespace": ns,
                                             "delete_volume": True}, k8s_env, tmp_path)
    assert rc != 0 and "delete_volume: true is not supported on the kubernetes backend" in failure(doc)
    assert cvm_api.get(ns, "web") is not None
    rc, doc = run_playbook("vm_delete.yml", {"owner": "alice", "name": "web", "vm_namespace": ns}, k8s_env, tmp_path)
    assert rc == 0, failure(doc)
    wait_for(lambda: cvm_api.get(ns, "web") is None, 60, "CloudVM web gone")
    # nor is the volume the delete kept deleted by a second run asking for it
    rc, doc = run_playbook("vm_delete.yml", {"owner": "alice", "name": "web", "vm_namespace": ns,
                                             "delete_volume": True}, k8s_env, tmp_path)
    assert rc != 0 and "delete_volume: true is not supported on the kubernetes backend" in failure(doc)
    assert "claim web-root" in failure(doc)
    # the root volume stays: image (marked), PV, claim Bound
    assert rbd.meta(ref)[META_OWNER] == "alice"
    assert exists_pv(core, pv_name)
    assert core.read_namespaced_persistent_volume_claim("web-root", ns).status.phase == "Bound"


def test_vm_backup_and_vm_restore_on_kubernetes_round_trip_the_data(
    k8s_env: dict[str, str], cvm_api: CloudVMs, ceph_cluster: CephCluster, rbd: Rbd, core: Any,
    k8s_namespace: str, image_set: Path, pvs: list[str], tmp_path: Path, play: Callable[..., PlayRun],
) -> None:
    ns = k8s_namespace
    pvs.extend([f"{ns}.web-root", f"{ns}.web2-root"])
    ref = ImageRef("rbd", f"{ns}.web-root")
    made = play([claim_task(ns, "web-root", "alice", image_set.parent, image_set.name)],
                env=ceph_env(ceph_cluster)).results[0]
    assert not made.get("failed"), made
    cvm_api.create(ns, "web", powerState="Stopped", bootID=0)  # never started: no status, offline
    write_at(ceph_cluster, ref, 3 * MiB, b"written-before-backup", str(tmp_path))
    backups = tmp_path / "backups"
    backups.mkdir()

    rc, doc = run_playbook("vm_backup.yml", {"owner": "alice", "name": "web", "vm_namespace": ns,
                                             "backup_dir": str(backups)}, k8s_env, tmp_path)
    assert rc == 0, failure(doc)
    backup = task_result(doc, "Back up the root volume (refused while it is in use)")
    assert backup["changed"] is True and backup["type"] == "full"
    # recorded as an Event of the CloudVM (there is no host store on Kubernetes)
    (event,) = core.list_namespaced_event(ns, field_selector="involvedObject.name=web").items
    assert (event.type, event.reason, event.involved_object.kind, event.involved_object.uid) == (
        "Normal", "BackupCompleted", "CloudVM", cvm_api.get(ns, "web")["metadata"]["uid"])
    assert event.message == (f"backup {backup['backup_id']} (full) of rbd/{ns}.web-root into {backups}/{ns}_web by "
                             "alice for owner alice")

    write_at(ceph_cluster, ref, 3 * MiB, b"changed-after-backup!", str(tmp_path))
    rc, doc = run_playbook("vm_restore.yml", {"backup": backup["backup_id"], "backup_dir": str(backups),
                                              "name": "web2", "vm_namespace": ns, "start": False,
                                              "ssh_public_key": PUBKEY}, k8s_env, tmp_path)
    assert rc == 0, failure(doc)
    restored = ImageRef("rbd", f"{ns}.web2-root")
    data = read_image(ceph_cluster, restored, str(tmp_path / "restored.raw"))
    assert data[3 * MiB:3 * MiB + 21] == b"written-before-backup"
    assert MARKER in data[MiB:MiB + 64]
    assert rbd.meta(restored)[META_OWNER] == "alice"
    pvc = core.read_namespaced_persistent_volume_claim("web2-root", ns)
    assert (pvc.spec.volume_name, pvc.status.phase, pvc.metadata.labels[OWNER_LABEL]) == (
        f"{ns}.web2-root", "Bound", "alice")
    vm = cvm_api.get(ns, "web2")
    assert vm is not None and (vm["spec"]["owner"], vm["spec"]["rootVolumeClaim"]) == ("alice", "web2-root")
    (event,) = core.list_namespaced_event(ns, field_selector="involvedObject.name=web2").items
    assert (event.type, event.reason, event.involved_object.uid) == ("Normal", "RestoreCompleted", None)
    assert event.message == f"backup {backup['backup_id']} restored into rbd/{ns}.web2-root by alice for owner alice"

    # the same backup restored with the host backend: a file volume in the host store ([backup-everywhere], a VM
    # moved out of the cluster; tests below move one in)
    host_config = _host_config(tmp_path, image_set)
    rc, doc = run_playbook("vm_restore.yml", {"backup": backup["backup_id"], "backup_dir": str(backups),
                                              "name": "back", "vm_namespace": ns, "start": False,
                                              "ssh_public_key": PUBKEY},
                           {"ZJUSCT_CLOUD_BACKEND": "host", "ZJUSCT_CLOUD_CONFIG": str(host_config)}, tmp_path)
    assert rc == 0, failure(doc)
    back = _host_volume(host_config, "back")
    assert back is not None and (back["driver"], back["owner"]) == ("file", "alice"), back
    with open(back["location"], "rb") as f:
        f.seek(3 * MiB)
        assert f.read(21) == b"written-before-backup"


def _host_config(tmp_path: Path, image_set: Path) -> Path:
    """A private host store whose file volumes are copies of ``image_set``'s rootfs (no network, no guest)."""
    config = {"node": "move", "store_path": str(tmp_path / "host" / "cloud.db"), "images_dir": str(image_set.parent),
              "default_image": image_set.name, "volumes_dir": str(tmp_path / "host" / "volumes"),
              "state_dir": str(tmp_path / "host" / "state"), "runtime_dir": str(tmp_path / "host" / "run"),
              "log_dir": str(tmp_path / "host" / "log"), "netns": ""}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(config))
    return path


def _host_volume(host_config: Path, vm: str) -> dict | None:
    params = {k: v.get("default") for k, v in root_volume_info_argument_spec().items()}
    params.update(backend="host", host_config=str(host_config), vm=vm)
    return run_root_volume_info(params, False)["volume"]


def test_a_backup_of_a_host_vm_restores_on_kubernetes(
    k8s_env: dict[str, str], cvm_api: CloudVMs, ceph_cluster: CephCluster, rbd: Rbd, core: Any,
    k8s_namespace: str, image_set: Path, pvs: list[str], tmp_path: Path, play: Callable[..., PlayRun],
) -> None:
    """[backup-everywhere] "restore anywhere": a backup vm_backup.yml took of a host VM's file volume is restored by
    vm_restore.yml on Kubernetes as an RBD image with its PV and claim and a CloudVM on it, owner mark kept (the way
    a user who outgrows one machine moves into the cluster; the other way is in the round-trip test above)."""
    ns = k8s_namespace
    pvs.append(f"{ns}.moved-root")
    host_config = _host_config(tmp_path, image_set)
    host_env = {"ZJUSCT_CLOUD_BACKEND": "host", "ZJUSCT_CLOUD_CONFIG": str(host_config)}
    backups = tmp_path / "backups"
    backups.mkdir()

    made = play([{"zjusct.cloud.cloudvm": {"name": "web", "namespace": ns, "owner": "alice", "wait": False,
                                           "backend": "host", "host_config": str(host_config)}}]).results[0]
    assert not made.get("failed") and made["changed"], made
    volume = _host_volume(host_config, "web")
    assert volume is not None and volume["driver"] == "file", volume
    with open(volume["location"], "r+b") as f:
        f.seek(3 * MiB)
        f.write(b"written-on-the-host")
    rc, doc = run_playbook("vm_backup.yml", {"owner": "alice", "name": "web", "vm_namespace": ns,
                                             "backup_dir": str(backups)}, host_env, tmp_path)
    assert rc == 0, failure(doc)
    on_host = task_result(doc, "Back up the root volume (refused while it is in use)")
    assert (on_host["driver"], on_host["type"]) == ("file", "full"), on_host
    rc, doc = run_playbook("vm_restore.yml", {"backup": on_host["backup_id"], "backup_dir": str(backups),
                                              "name": "moved", "vm_namespace": ns, "start": False,
                                              "ssh_public_key": PUBKEY}, k8s_env, tmp_path)
    assert rc == 0, failure(doc)
    moved = ImageRef("rbd", f"{ns}.moved-root")
    data = read_image(ceph_cluster, moved, str(tmp_path / "moved.raw"))
    assert data[3 * MiB:3 * MiB + 19] == b"written-on-the-host" and MARKER in data[MiB:MiB + 64]
    assert rbd.meta(moved)[META_OWNER] == "alice"
    pvc = core.read_namespaced_persistent_volume_claim("moved-root", ns)
    assert (pvc.spec.volume_name, pvc.status.phase) == (f"{ns}.moved-root", "Bound")
    vm = cvm_api.get(ns, "moved")
    assert vm is not None and (vm["spec"]["owner"], vm["spec"]["rootVolumeClaim"]) == ("alice", "moved-root")

