"""The host backend's rbd volume driver (storage.rbd_clone) against the real test cluster: template import once per
image
set under concurrent runs, clone with ownership marks, V2 watcher detection, adoption rules, delete, and the release
of a stale claim when a VM is re-created on its kept volume."""

from __future__ import annotations

import threading

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import settle
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import rbd_clone as rv
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

pytestmark = [pytest.mark.ceph]


@pytest.fixture
def settings(ceph_cluster) -> dict:
    return {"pool": "rbd", "conf": str(ceph_cluster.conf), "user": "admin", "keyring_path": str(ceph_cluster.keyring)}


@pytest.fixture
def image_set(tmp_path, image_name) -> dict:
    d = tmp_path / f"set-{image_name}"
    d.mkdir()
    with open(d / "rootfs.raw", "wb") as fh:
        fh.truncate(16 * 1024 * 1024)
        fh.seek(5 * 1024 * 1024)
        fh.write(b"root file system bytes")
    return {"dir": str(d)}


def test_concurrent_runs_import_the_template_exactly_once(rbd, settings, image_set):
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.append(rv.ensure_template(rv._client(settings), "rbd", image_set["dir"]))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert errors == []
    refs = {ref for ref, _imported in results}
    assert len(refs) == 1 and sum(imported for _ref, imported in results) == 1
    names = rbd.ls("rbd")
    template = refs.pop()
    assert template.image in names and not [n for n in names if ".importing-" in n]
    assert [s["protected"] for s in rbd.snapshots(template.at(None)) if s["name"] == "base"] == ["true"]
    assert rv.ensure_template(rv._client(settings), "rbd", image_set["dir"]) == (template, False)


def test_clone_marks_claims_detects_writers_and_deletes(rbd, settings, image_set, image_name, watcher):
    created = rv.create_clone(settings, image_name, image_set, "alice", None)
    assert created == {"location": f"rbd/{image_name}", "size_mib": 16}
    ref = ImageRef("rbd", image_name)
    assert rbd.meta(ref) == {"cloud.zjusct.io/owner": "alice"}
    assert rbd.info(ref)["parent"]["snapshot"] == "base"
    with pytest.raises(VolumeError, match="already exists but is not in the host store"):
        rv.create_clone(settings, image_name, image_set, "alice", None)
    volume = {"name": image_name, "driver": "rbd", "location": created["location"]}
    rv.claim(settings, volume, "uid-1")
    with pytest.raises(VolumeError, match="claimed by CloudVM uid uid-1"):
        rv.claim(settings, volume, "uid-2")
    assert rv.writer(settings, volume) is None
    watcher(ref)
    found = rv.writer(settings, volume)
    assert found is not None and "(client." in found
    with pytest.raises(VolumeError, match="has watchers"):
        rv.delete(settings, volume)


def test_adopt_checks_owner_and_claim(rbd, settings, image_name):
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, size_mib=8)
    assert rv.adopt(settings, image_name, "bob") == {"location": ref.spec, "size_mib": 8, "changed": True}
    assert rv.adopt(settings, ref.spec, "bob")["changed"] is False
    with pytest.raises(VolumeError, match="does not match the owner mark 'bob'"):
        rv.adopt(settings, ref.spec, "carol")
    rbd.meta_set(ref, "cloud.zjusct.io/claimed-by", "uid-9")
    with pytest.raises(VolumeError, match="claimed by CloudVM uid uid-9"):
        rv.adopt(settings, ref.spec, "bob")
    with pytest.raises(VolumeError, match="does not exist"):
        rv.adopt(settings, "rbd/no-such-image", "bob")


def test_a_stale_claim_stays_while_another_mark_or_a_watcher_remains(
        rbd, settings, image_name, watcher, tmp_path):
    """Re-create on a kept rbd volume (host.volume_claim.settle): refused while another mark or a watcher remains."""
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, size_mib=8)
    with HostStore(str(tmp_path / "cloud.db")) as store:
        store.put_volume({"name": image_name, "driver": "rbd", "location": ref.spec, "size_mib": 8,
                          "owner": "bob", "claimed_by": "uid-gone"})
        volume = store.get_volume(image_name)
        rbd.meta_set(ref, "cloud.zjusct.io/claimed-by", "uid-elsewhere")
        with pytest.raises(CloudVMError, match="marked claimed by CloudVM uid uid-elsewhere"):
            settle(store, volume, "bob", None, creating=True, rbd=settings, subject="default/bob")
        rbd.meta_set(ref, "cloud.zjusct.io/claimed-by", "uid-gone")
        watcher(ref)
        with pytest.raises(CloudVMError, match=r"still in use by RBD image .* has watchers"):
            settle(store, volume, "bob", None, creating=True, rbd=settings, subject="default/bob")
        assert rbd.meta(ref)["cloud.zjusct.io/claimed-by"] == "uid-gone"
        assert store.get_volume(image_name)["claimed_by"] == "uid-gone"


def test_a_stale_claim_without_writer_is_released_on_the_image(rbd, settings, image_name, tmp_path):
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, size_mib=8)
    rbd.meta_set(ref, "cloud.zjusct.io/claimed-by", "uid-gone")
    with HostStore(str(tmp_path / "cloud.db")) as store:
        store.put_volume({"name": image_name, "driver": "rbd", "location": ref.spec, "size_mib": 8,
                          "owner": "bob", "claimed_by": "uid-gone"})
        after = settle(store, store.get_volume(image_name), "bob", None, creating=True, rbd=settings,
                       subject="default/bob")
        assert after["claimed_by"] is None and store.get_volume(image_name)["claimed_by"] is None
    assert "cloud.zjusct.io/claimed-by" not in rbd.meta(ref)
    rv.claim(settings, {"name": image_name, "driver": "rbd", "location": ref.spec}, "uid-new")
    assert rbd.meta(ref)["cloud.zjusct.io/claimed-by"] == "uid-new"


def test_host_volume_over_the_disk_quota_is_refused_unmarked_and_audited(rbd, settings, image_name, tmp_path):
    import json

    from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import (
        VolumeQuotaError,
        adopt_volume,
    )

    (tmp_path / "images" / "tiny-1").mkdir(parents=True)
    (tmp_path / "images" / "tiny-1" / "manifest.json").write_text(json.dumps({"name": "tiny"}))
    cfg = tmp_path / "host.json"
    cfg.write_text(json.dumps({"store_path": str(tmp_path / "cloud.db"), "images_dir": str(tmp_path / "images"),
                               "default_image": "tiny", "volume_driver": "rbd", "rbd": settings}))
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, size_mib=64)
    with HostStore(str(tmp_path / "cloud.db")) as store:
        store.put_quota("bob", {"disk_mib": 32})
    params = {"name": "bob-r-root", "owner": "bob", "rbd_image": image_name, "image": None,
              "host_config": str(cfg), "actor": None}
    with pytest.raises(VolumeQuotaError, match=r"would use 64 of quota 32 MiB of disk .* asked by rbd_image") as exc:
        adopt_volume(params)
    assert exc.value.details["reason"] == "QuotaExceeded"
    assert rbd.meta(ref) == {}  # the image keeps its marks: no owner mark written
    with HostStore(str(tmp_path / "cloud.db")) as store:
        assert store.get_volume("bob-r-root") is None
        store.put_quota("bob", {"disk_mib": 64})
    assert adopt_volume(params)["volume"]["size_mib"] == 64
    assert rbd.meta(ref) == {"cloud.zjusct.io/owner": "bob"}
    with HostStore(str(tmp_path / "cloud.db")) as store:
        assert [(r["action"], r["result"], r["actor"], r["owner"]) for r in store.audit(owner="bob")] == [
            ("volume-register", "refused", "bob", "bob"), ("volume-register", "succeeded", "bob", "bob")]
