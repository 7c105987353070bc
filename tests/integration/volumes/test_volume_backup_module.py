"""The volume_backup module's body (volume_backup_module.run_volume_backup) on a real host store and real
files: a host store volume backed up by name (its owner checked), restored as a NEW volume of the host's driver or
another, registered for its owner with the disk quota checked on this receiving host, audited; check mode.
No guest and no Ceph here (tests/e2e/host/test_volume_backups.py runs the playbooks with a real guest;
tests/integration/ceph/test_rbd_backup.py restores across file and RBD)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.rbd_backup_module import run_rbd_backup
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import BLOCK_SIZE, BackupError
from ansible_collections.zjusct.cloud.plugins.module_utils.volume_backup_module import (
    run_volume_backup,
    volume_backup_argument_spec,
)

MiB = 1024 * 1024


@pytest.fixture
def host(tmp_path: Path) -> dict:
    images = tmp_path / "images"
    (images / "tiny-1").mkdir(parents=True)
    (images / "tiny-1" / "manifest.json").write_text(json.dumps({"name": "tiny"}))
    volumes = tmp_path / "volumes"
    volumes.mkdir()
    cfg = {"store_path": str(tmp_path / "cloud.db"), "images_dir": str(images), "default_image": "tiny",
           "volumes_dir": str(volumes), "volume_driver": "file"}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(cfg))
    vol = volumes / "alice-root.raw"
    with open(vol, "wb") as f:
        f.truncate(24 * MiB)
        f.seek(BLOCK_SIZE)
        f.write(b"alice's data" * 1000)
    with HostStore(cfg["store_path"]) as store:
        store.put_volume({"name": "alice-root", "driver": "file", "location": str(vol), "size_mib": 24,
                          "owner": "alice", "image": str(images / "tiny-1")})
    return {"config": str(path), "store": cfg["store_path"], "volumes": volumes, "dest": str(tmp_path / "bk"),
            "vol": vol}


def params(host: dict, **kw) -> dict:
    """The module's parameters with its defaults, as AnsibleModule hands them over."""
    out = {k: v.get("default") for k, v in volume_backup_argument_spec().items()}
    out.update(dest=host["dest"], host_config=host["config"], timeout=120.0)
    out.update(kw)
    return out


def audit(host: dict) -> list:
    with HostStore(host["store"]) as store:
        return [(r["action"], r["subject"], r["result"], r["actor"]) for r in store.audit()]


def volume(host: dict, name: str):
    with HostStore(host["store"]) as store:
        return store.get_volume(name)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_a_volume_is_backed_up_by_its_name_only_for_its_owner_and_audited(host):
    with pytest.raises(CloudError, match=r"owner: 'bob' is not the owner 'alice' of volume 'alice-root'"):
        run_volume_backup(params(host, volume="alice-root", owner="bob", actor="bob"), False)
    assert not os.path.exists(host["dest"])
    planned = run_volume_backup(params(host, volume="alice-root", owner="alice"), True)
    assert (planned["type"], planned["driver"], planned["volume"]) == ("full", "file", "alice-root")
    assert not os.path.exists(host["dest"])  # check mode writes nothing
    done = run_volume_backup(params(host, volume="alice-root", owner="alice", vm="default/alice", actor="alice"),
                             False)
    assert (done["type"], done["driver"], done["owner"], done["data_bytes"]) == ("full", "file", "alice", BLOCK_SIZE)
    assert done["image_size_bytes"] == 24 * MiB and done["removed_snapshots"] == []
    again = run_volume_backup(params(host, volume="alice-root", owner="alice", actor="alice"), False)
    assert again["type"] == "diff" and again["data_bytes"] == 0 and again["chain"][0] == done["backup_id"]
    assert audit(host) == [("backup", "volume/alice-root", "failed", "bob"),
                           ("backup", "volume/alice-root", "succeeded", "alice"),
                           ("backup", "volume/alice-root", "succeeded", "alice")]
    verified = run_volume_backup(params(host, state="verified"), False)
    assert verified["backup_id"] == again["backup_id"] and verified["driver"] == "file"


@pytest.mark.parametrize("driver", ["file", "qcow2"])
def test_a_restore_makes_a_new_volume_of_the_hosts_or_the_asked_driver_registered_for_the_owner(host, driver):
    bk = run_volume_backup(params(host, volume="alice-root", owner="alice"), False)
    res = run_volume_backup(params(host, state="restored", target_volume="alice-r-root", target_driver=driver,
                                   owner="alice", actor="alice"), False)
    suffix = "raw" if driver == "file" else "qcow2"
    where = str(host["volumes"] / f"alice-r-root.{suffix}")
    assert (res["changed"], res["driver"], res["location"], res["backup_id"]) == (True, driver, where,
                                                                                 bk["backup_id"])
    assert res["verified_blocks"] == 6
    record = volume(host, "alice-r-root")
    assert {k: record[k] for k in ("driver", "location", "size_mib", "owner")} == \
        {"driver": driver, "location": where, "size_mib": 24, "owner": "alice"}
    assert record["image"].endswith("tiny-1")
    if driver == "file":
        assert sha256(where) == sha256(host["vol"])
    assert audit(host)[-2:] == [("restore", "volume/alice-r-root", "succeeded", "alice"),
                                ("volume-register", "volume/alice-r-root", "succeeded", "alice")]
    # the same restore again changes nothing; another backup into the same name is refused
    same = run_volume_backup(params(host, state="restored", target_volume="alice-r-root", target_driver=driver,
                                    owner="alice", backup_id=bk["backup_id"]), False)
    assert same["changed"] is False and same["backup_id"] == bk["backup_id"]
    with pytest.raises(CloudError, match=r"target_volume: volume 'alice-root' already exists \(file"):
        run_volume_backup(params(host, state="restored", target_volume="alice-root", owner="alice"), False)


def test_a_restore_over_the_disk_quota_is_refused_before_anything_is_written_and_audited(host):
    run_volume_backup(params(host, volume="alice-root", owner="alice"), False)
    with HostStore(host["store"]) as store:
        store.put_quota("alice", {"disk_mib": 30})  # alice-root (24) + 24 more would be 48
    with pytest.raises(CloudError, match="disk_mib") as err:
        run_volume_backup(params(host, state="restored", target_volume="alice-r-root", owner="alice",
                                 actor="alice"), False)
    assert err.value.failure()["reason"] == "QuotaExceeded"
    assert sorted(p.name for p in host["volumes"].iterdir()) == ["alice-root.raw"]
    assert volume(host, "alice-r-root") is None
    assert audit(host)[-1][:3] == ("restore", "volume/alice-r-root", "failed")


def test_a_backup_is_restored_for_another_owner_only_by_an_operator(host):
    run_volume_backup(params(host, volume="alice-root", owner="alice"), False)
    with pytest.raises(BackupError, match=r"owner: 'bob' is not the owner 'alice' of backup"):
        run_volume_backup(params(host, state="restored", target_volume="bob-root", owner="bob"), False)
    assert volume(host, "bob-root") is None and not (host["volumes"] / "bob-root.raw").exists()
    given = run_volume_backup(params(host, state="restored", target_volume="bob-root", owner="bob",
                                     operator=True), False)
    assert given["owner"] == "bob" and volume(host, "bob-root")["owner"] == "bob"


def test_a_file_given_by_path_restores_into_a_path_and_bad_forms_name_the_options(host, tmp_path):
    done = run_volume_backup(params(host, path=str(host["vol"]), driver="file", host_config=None), False)
    assert done["volume"] is None and done["driver"] == "file"
    out = run_volume_backup(params(host, state="restored", target_path=str(tmp_path / "out.raw"),
                                   host_config=None), False)
    assert sha256(out["location"]) == sha256(host["vol"])
    with pytest.raises(CloudError, match=r"state=present needs exactly one of volume, path, name \(got volume, "
                                         r"path\)"):
        run_volume_backup(params(host, volume="alice-root", path=str(host["vol"])), False)
    with pytest.raises(CloudError, match=r"driver: 'rbd' with path: a file-backed volume is one of file, qcow2"):
        run_volume_backup(params(host, path=str(host["vol"]), driver="rbd"), False)
    with pytest.raises(CloudError, match=r"dest: 's3://b/x' is a destination of kind s3"):
        run_volume_backup(params(host, volume="alice-root", dest="s3://b/x"), False)
    with pytest.raises(CloudError, match=r"keep: 0 is outside the range 1-10000"):
        run_volume_backup(params(host, volume="alice-root", keep=0), False)
    with pytest.raises(CloudError, match=r"state=present needs exactly one of volume, path, name \(got none\)"):
        run_rbd_backup(params(host, name=None), False)
