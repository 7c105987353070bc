"""host_volume's disk quota and audit record, and rbd_backup's audit record, with a real SQLite host store.

The RBD side is a fake here (an in-memory image table for ``storage.rbd_clone.adopt``; a body returning or raising for
``rbd_backup``); tests/integration/ceph/test_volume_rbd.py and tests/e2e/backup run the same code on real Ceph.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import volumes as hv
from ansible_collections.zjusct.cloud.plugins.module_utils.host.backup_audit import run_audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import BackupError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError


@pytest.fixture
def host(tmp_path: Path) -> dict:
    images = tmp_path / "images"
    (images / "tiny-1").mkdir(parents=True)
    (images / "tiny-1" / "manifest.json").write_text(json.dumps({"name": "tiny"}))
    cfg = {"store_path": str(tmp_path / "cloud.db"), "images_dir": str(images), "default_image": "tiny",
           "volume_driver": "rbd", "rbd": {"pool": "rbd", "conf": "/etc/ceph/ceph.conf", "user": "cloud",
                                           "keyring_path": "/etc/ceph/k"}}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(cfg))
    return {"path": str(path), "store": cfg["store_path"]}


class FakeCeph:
    """Images ``pool/name`` -> size (MiB) and owner mark; ``adopt`` follows storage.rbd_clone.adopt's order."""

    def __init__(self) -> None:
        self.images: dict = {}
        self.during: Optional[Callable[[], None]] = None  # runs after admit (a concurrent run)

    def adopt(self, rbd: dict, location: str, owner: str, admit: Any = None) -> dict:
        image = self.images[location]
        if image["owner"] and image["owner"] != owner:
            raise VolumeError(f"owner: {owner!r} does not match the owner mark {image['owner']!r} of {location}")
        if admit is not None:
            admit(image["size_mib"])
        if self.during:
            self.during()
        changed = not image["owner"]
        image["owner"] = owner
        return {"location": location, "size_mib": image["size_mib"], "changed": changed}

    def unmark_owner(self, rbd: dict, location: str) -> None:
        self.images[location]["owner"] = None


@pytest.fixture
def ceph(monkeypatch: pytest.MonkeyPatch) -> FakeCeph:
    fake = FakeCeph()
    monkeypatch.setattr(hv.rbdvol, "adopt", fake.adopt)
    monkeypatch.setattr(hv.rbdvol, "unmark_owner", fake.unmark_owner)
    return fake


def register(host: dict, name: str, owner: str, image: str, check_mode: bool = False, **extra: Any) -> dict:
    return hv.adopt_volume(dict({"name": name, "owner": owner, "rbd_image": image, "image": None,
                                 "host_config": host["path"]}, **extra), check_mode)


def audit(host: dict, **filters: Any) -> list:
    with HostStore(host["store"]) as store:
        return store.audit(**filters)


def test_registration_over_the_disk_quota_is_refused_records_nothing_and_is_audited(host, ceph) -> None:
    ceph.images["rbd/bob-restored-root"] = {"size_mib": 2048, "owner": None}
    with HostStore(host["store"]) as store:
        store.put_quota("bob", {"disk_mib": 3000})
        store.put_volume({"name": "bob-root", "driver": "rbd", "location": "rbd/bob-root", "size_mib": 1024,
                          "owner": "bob", "image": "/x"})
    with pytest.raises(hv.VolumeQuotaError) as refused:
        register(host, "bob-restored-root", "bob", "bob-restored-root", actor="alice")
    assert str(refused.value) == (
        "disk_mib: owner 'bob' would use 3072 of quota 3000 MiB of disk (in use 1024, this request 2048, asked by"
        " rbd_image (the size of rbd/bob-restored-root)); delete another VM with delete_volume=true of 'bob', or"
        " ask the operator to raise owner_quota disk_mib")
    assert refused.value.details == {"reason": "QuotaExceeded", "quota": "disk_mib", "owner": "bob", "limit": 3000,
                                     "in_use": 1024, "requested": 2048}
    assert ceph.images["rbd/bob-restored-root"]["owner"] is None  # refused before the mark
    with HostStore(host["store"]) as store:
        assert store.get_volume("bob-restored-root") is None
    [record] = audit(host)
    assert (record["actor"], record["action"], record["subject"], record["owner"], record["result"],
            record["reason"]) == ("alice", "volume-register", "volume/bob-restored-root", "bob", "refused",
                                  "QuotaExceeded")
    assert record["message"] == str(refused.value)
    assert record["data"] == {"rbd_image": "rbd/bob-restored-root"}


def test_registration_within_the_quota_is_audited_once_and_check_mode_writes_nothing(host, ceph) -> None:
    ceph.images["rbd/bob-r-root"] = {"size_mib": 2048, "owner": None}
    with HostStore(host["store"]) as store:
        store.put_quota("bob", {"disk_mib": 2048})
    assert register(host, "bob-r-root", "bob", "rbd/bob-r-root", check_mode=True)["changed"] is True
    assert audit(host) == []
    got = register(host, "bob-r-root", "bob", "rbd/bob-r-root")
    assert got["changed"] is True and got["volume"]["size_mib"] == 2048
    assert register(host, "bob-r-root", "bob", "rbd/bob-r-root")["changed"] is False  # no record
    [record] = audit(host, owner="bob")
    assert (record["actor"], record["action"], record["result"], record["data"]) == \
        ("bob", "volume-register", "succeeded", {"rbd_image": "rbd/bob-r-root", "size_mib": 2048})
    assert ceph.images["rbd/bob-r-root"]["owner"] == "bob"


def test_a_concurrent_registration_that_took_the_quota_undoes_the_mark(host, ceph) -> None:
    ceph.images["rbd/bob-a-root"] = {"size_mib": 1024, "owner": None}
    with HostStore(host["store"]) as store:
        store.put_quota("bob", {"disk_mib": 1500})

    def other_run() -> None:  # between this run's first check and its transaction
        with HostStore(host["store"]) as store:
            store.put_volume({"name": "bob-b-root", "driver": "rbd", "location": "rbd/bob-b-root", "size_mib": 1024,
                              "owner": "bob", "image": "/x"})

    ceph.during = other_run
    with pytest.raises(hv.VolumeQuotaError, match="would use 2048 of quota 1500"):
        register(host, "bob-a-root", "bob", "bob-a-root")
    assert ceph.images["rbd/bob-a-root"]["owner"] is None
    with HostStore(host["store"]) as store:
        assert store.get_volume("bob-a-root") is None
    assert [r["result"] for r in audit(host)] == ["refused"]


def test_a_failed_registration_is_audited_as_failed(host, ceph) -> None:
    ceph.images["rbd/x-root"] = {"size_mib": 8, "owner": "carol"}
    with pytest.raises(VolumeError, match="does not match the owner mark 'carol'"):
        register(host, "x-root", "bob", "x-root")
    [record] = audit(host)
    assert (record["result"], record["reason"], record["owner"]) == ("failed", "VolumeError", "bob")


# --- rbd_backup -----------------------------------------------------------------------------------------
def backup_params(host: dict, **extra: Any) -> dict:
    return dict({"state": "present", "pool": "rbd", "name": "alice-root", "dest": "/srv/b/default_alice",
                 "vm": "default/alice", "owner": "alice", "keep": 2, "full_every": 7, "force_full": False,
                 "host_config": host["path"], "actor": None, "operator": False, "ceph_key": "AQBsecret==",
                 "ceph_keyring": "/etc/ceph/k", "backup_id": None, "target_pool": None, "target_name": None,
                 "keep_snapshots": False}, **extra)


def test_a_backup_is_audited_with_what_it_pruned_and_no_connection_setting(host) -> None:
    result = {"changed": True, "backup_id": "20261130T064323Z-a904c0", "type": "diff", "owner": "alice",
              "chain": ["20261129T064323Z-000000", "20261130T064323Z-a904c0"], "image_size_bytes": 1 << 30,
              "retention": {"deleted": ["20261128T064323Z-111111"]}, "removed_snapshots": ["s1"]}
    assert run_audited(backup_params(host, actor="op1", operator=True), lambda: result) is result
    [record] = audit(host, owner="alice")
    assert (record["actor"], record["operator"], record["action"], record["subject"], record["result"]) == \
        ("op1", True, "backup", "rbd/rbd/alice-root", "succeeded")
    assert record["data"]["pruned"] == ["20261128T064323Z-111111"] and record["data"]["type"] == "diff"
    assert "pruned 20261128T064323Z-111111" in record["message"]
    assert "AQBsecret" not in json.dumps(record) and "/etc/ceph/k" not in json.dumps(record)


def test_a_failed_restore_is_audited_and_the_error_still_raised(host) -> None:
    def body() -> dict:
        raise BackupError("restore refused, backup damaged: block 7")

    params = backup_params(host, state="restored", target_name="alice-r3-root", backup_id="20261130T064323Z-a904c0")
    with pytest.raises(BackupError, match="block 7"):
        run_audited(params, body)
    [record] = audit(host)
    assert (record["actor"], record["action"], record["subject"], record["result"], record["reason"]) == \
        ("alice", "restore", "rbd/rbd/alice-r3-root", "failed", "BackupError")


def test_verify_check_mode_and_no_host_config_record_nothing(host) -> None:
    run_audited(backup_params(host, state="verified"), lambda: {"changed": False})
    run_audited(backup_params(host), lambda: {"changed": True}, check_mode=True)
    run_audited(backup_params(host, host_config=None), lambda: {"changed": True})
    assert audit(host) == []


def test_an_unchanged_restore_is_recorded_as_such(host) -> None:
    """Its intent was recorded before the image was looked at; the outcome says nothing was restored."""
    run_audited(backup_params(host, state="restored", target_name="t"),
                lambda: {"changed": False, "msg": "rbd/t already restored from backup b1"})
    [record] = audit(host)
    assert (record["action"], record["result"]) == ("restore", "succeeded") and record["ended"]
    assert record["message"] == "unchanged: rbd/t already restored from backup b1"


def test_a_backup_killed_midway_leaves_its_intent(host) -> None:
    """The intent is committed before the body runs: a body that never returns (SIGKILL) leaves it requested."""
    seen = []

    def body() -> dict:
        seen.extend(audit(host))  # what a killed run leaves: the store as the body found it
        return {"changed": True, "backup_id": "b9", "type": "full"}

    run_audited(backup_params(host), body)
    [intent] = seen
    assert (intent["action"], intent["result"], intent["ended"]) == ("backup", "requested", None)
    assert "requested" in intent["message"] and intent["data"]["dest"]
    [done] = audit(host)
    assert (done["id"], done["result"], done["data"]["backup_id"]) == (intent["id"], "succeeded", "b9")


def test_an_unreadable_host_config_fails_before_any_backup(tmp_path: Path) -> None:
    ran = []
    with pytest.raises(ValueError, match=r"host_config: .*does not exist"):
        run_audited({"state": "present", "host_config": str(tmp_path / "nope.json")}, lambda: ran.append(1) or {})
    assert ran == []
