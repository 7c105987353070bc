"""Volume claims on the host backend (plugins/module_utils/host/volume_claim.py) with a real SQLite host store.

The end-to-end twins with real guests are in tests/e2e/host/test_recreate_and_errors.py; these run the
rules and the module's create path on a tiny image set (no guest boots: the VMs are never started).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import cloudvm_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as host
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import judge, settle
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import with_defaults
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import file_writers


@pytest.fixture
def store(tmp_path):
    s = HostStore(str(tmp_path / "cloud.db"))
    yield s
    s.close()


def volume(store: HostStore, tmp_path: Path, claimed_by=None, owner="bob", name="bob-root") -> dict:
    path = tmp_path / f"{name}.raw"
    path.write_bytes(b"\0" * 4096)
    store.put_volume({"name": name, "driver": "file", "location": str(path), "size_mib": 1, "owner": owner,
                      "claimed_by": claimed_by})
    return store.get_volume(name)


def vm(store: HostStore, name="bob", owner="bob", namespace="default", claim="bob-root") -> dict:
    return store.create_vm(namespace, name, with_defaults({"owner": owner, "rootVolumeClaim": claim}))


def no_writers():
    return []


def no_mark():
    return None


def test_another_owners_volume_is_refused(store, tmp_path):
    vol = volume(store, tmp_path, owner="dave")
    with pytest.raises(CloudVMError, match="volume 'bob-root' belongs to owner 'dave', not 'bob'"):
        judge(store, vol, "bob", None, creating=True, writers=no_writers, rbd_mark=no_mark)


def test_a_claim_of_an_existing_cloudvm_is_refused_naming_it(store, tmp_path):
    holder = vm(store)
    vol = volume(store, tmp_path, claimed_by=holder["metadata"]["uid"])
    with pytest.raises(CloudVMError) as caught:
        judge(store, vol, "bob", None, creating=True, writers=no_writers, rbd_mark=no_mark)
    message = str(caught.value)
    assert f"held by CloudVM default/bob (uid {holder['metadata']['uid']}, owner bob)" in message
    assert "playbooks/vm_delete.yml -e owner=bob -e name=bob -e vm_namespace=default" in message
    assert "docs/runbooks.md" in message


def test_an_unclaimed_volume_named_by_another_record_is_refused_at_create(store, tmp_path):
    vm(store)  # created, never started: no claim yet, but its spec names the volume
    vol = volume(store, tmp_path)
    with pytest.raises(CloudVMError, match="held by CloudVM default/bob"):
        judge(store, vol, "bob", None, creating=True, writers=no_writers, rbd_mark=no_mark)
    # the holder itself may use it
    mine = store.get_vm("default", "bob")["metadata"]["uid"]
    assert judge(store, vol, "bob", mine, creating=False, writers=no_writers, rbd_mark=no_mark).stale_uid is None


def test_a_stale_claim_without_writer_is_released(store, tmp_path):
    vol = volume(store, tmp_path, claimed_by="uid-of-a-deleted-vm")
    after = settle(store, vol, "bob", None, creating=True, rbd={}, subject="default/bob")
    assert after["claimed_by"] is None
    assert store.get_volume("bob-root")["claimed_by"] is None
    assert [e["reason"] for e in store.events("default/bob")] == ["ClaimReleased"]


def test_check_mode_releases_nothing(store, tmp_path):
    vol = volume(store, tmp_path, claimed_by="uid-of-a-deleted-vm")
    settle(store, vol, "bob", None, creating=True, rbd={}, subject="default/bob", check_mode=True)
    assert store.get_volume("bob-root")["claimed_by"] == "uid-of-a-deleted-vm"
    assert store.events() == []


def test_a_stale_claim_with_a_process_holding_the_file_is_refused_naming_it(store, tmp_path):
    vol = volume(store, tmp_path, claimed_by="uid-of-a-deleted-vm")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'r+b');"
                               " print('open', flush=True); time.sleep(120)", vol["location"]],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        assert [w.split(" (")[0] for w in file_writers(vol["location"])] == [f"pid {holder.pid}"]
        with pytest.raises(CloudVMError, match=f"still in use by pid {holder.pid} "):
            settle(store, vol, "bob", None, creating=True, rbd={}, subject="default/bob")
    finally:
        holder.kill()
        holder.wait()
    assert store.get_volume("bob-root")["claimed_by"] == "uid-of-a-deleted-vm"
    assert file_writers(vol["location"]) == []


def test_a_live_launcher_of_the_same_name_is_a_writer(store, tmp_path):
    vol = volume(store, tmp_path, claimed_by="uid-of-a-deleted-vm")
    with pytest.raises(CloudVMError, match=r"still in use by a launcher of default/bob \(pid 42\)"):
        settle(store, vol, "bob", None, creating=True, rbd={}, subject="default/bob",
               launcher_alive="a launcher of default/bob (pid 42)")


def test_an_rbd_mark_of_another_uid_is_refused(store, tmp_path):
    vol = dict(volume(store, tmp_path, claimed_by="uid-stale"), driver="rbd", location="rbd/bob-root")
    with pytest.raises(CloudVMError, match="marked claimed by CloudVM uid uid-other, unknown to this host"):
        judge(store, vol, "bob", None, creating=True, writers=no_writers, rbd_mark=lambda: "uid-other")
    assert judge(store, vol, "bob", None, creating=True, writers=no_writers,
                 rbd_mark=lambda: "uid-stale").stale_uid == "uid-stale"


def test_an_rbd_watcher_is_a_writer(store, tmp_path):
    vol = dict(volume(store, tmp_path, claimed_by="uid-stale"), driver="rbd", location="rbd/bob-root")
    with pytest.raises(CloudVMError, match="still in use by RBD image rbd/bob-root has watchers"):
        judge(store, vol, "bob", None, creating=True, rbd_mark=no_mark,
              writers=lambda: ["RBD image rbd/bob-root has watchers 1.2.3.4:0/1 (client.9)"])


# --- the module's create path (host backend), no guest started -----------------------------------------------
@pytest.fixture
def cfg_path(tmp_path):
    image = tmp_path / "images" / "tiny-1"
    image.mkdir(parents=True)
    (image / "rootfs.raw").write_bytes(b"\0" * (1024 * 1024))
    (image / "manifest.json").write_text(json.dumps({"name": "tiny", "builtAt": "2026-01-01T00:00:00Z"}))
    config = {"node": "unit", "store_path": str(tmp_path / "cloud.db"), "images_dir": str(tmp_path / "images"),
              "default_image": "tiny", "volumes_dir": str(tmp_path / "volumes"), "state_dir": str(tmp_path / "state"),
              "runtime_dir": str(tmp_path / "run"), "log_dir": str(tmp_path / "log"), "netns": "zjc-unit-none"}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(config))
    return str(path)


def params(cfg_path: str, **over) -> dict:
    out = {k: v.get("default") for k, v in cloudvm_argument_spec().items()}
    out.update(host_config=cfg_path, wait=False, **over)
    return out


def records(cfg_path: str) -> list[tuple]:
    with HostStore(json.loads(Path(cfg_path).read_text())["store_path"]) as s:
        return [(v["metadata"]["namespace"], v["metadata"]["name"]) for v in s.list_vms()]


def claim_of(cfg_path: str, name: str):
    with HostStore(json.loads(Path(cfg_path).read_text())["store_path"]) as s:
        return s.get_volume(name)["claimed_by"]


def set_claim(cfg_path: str, name: str, uid: str) -> None:
    with HostStore(json.loads(Path(cfg_path).read_text())["store_path"]) as s:
        s.put_volume(dict(s.get_volume(name), claimed_by=uid))


def test_recreate_on_the_kept_volume_takes_over_the_stale_claim(cfg_path):
    first = host.ensure(params(cfg_path, name="bob", owner="bob"))
    old_uid = first["cloudvm"]["metadata"]["uid"]
    set_claim(cfg_path, "bob-root", old_uid)  # as a start would have
    host.ensure(params(cfg_path, name="bob", state="absent"))
    assert records(cfg_path) == [] and claim_of(cfg_path, "bob-root") == old_uid

    again = host.ensure(params(cfg_path, name="bob", owner="bob"))
    assert again["changed"] is True and again["cloudvm"]["metadata"]["uid"] != old_uid
    assert claim_of(cfg_path, "bob-root") is None  # released; the first start claims it for the new uid


def test_refused_create_writes_no_record(cfg_path):
    holder = host.ensure(params(cfg_path, name="bob", owner="bob"))
    set_claim(cfg_path, "bob-root", holder["cloudvm"]["metadata"]["uid"])
    with pytest.raises(CloudVMError, match="held by CloudVM default/bob"):
        host.ensure(params(cfg_path, name="bob", namespace="other", owner="bob"))
    with pytest.raises(CloudVMError, match="belongs to owner 'bob', not 'erin'"):
        host.ensure(params(cfg_path, name="bob", namespace="other", owner="erin"))
    assert records(cfg_path) == [("default", "bob")]


def test_check_mode_create_on_a_stale_claim_changes_nothing(cfg_path):
    first = host.ensure(params(cfg_path, name="bob", owner="bob"))
    set_claim(cfg_path, "bob-root", first["cloudvm"]["metadata"]["uid"])
    host.ensure(params(cfg_path, name="bob", state="absent"))
    preview = host.ensure(params(cfg_path, name="bob", owner="bob", power_state="running"), check_mode=True)
    assert preview["changed"] is True and preview["boot_id"] == 1
    assert records(cfg_path) == [] and claim_of(cfg_path, "bob-root") == first["cloudvm"]["metadata"]["uid"]


def test_runbook_cleanup_of_a_kept_volume_whose_vm_is_gone(cfg_path):
    """docs/runbooks.md, Cleanup: create a stopped VM on the kept volume, then delete both."""
    first = host.ensure(params(cfg_path, name="bob", owner="bob"))
    set_claim(cfg_path, "bob-root", first["cloudvm"]["metadata"]["uid"])
    host.ensure(params(cfg_path, name="bob", state="absent"))
    location = Path(json.loads(Path(cfg_path).read_text())["volumes_dir"]) / "bob-root.raw"
    assert location.exists()

    again = host.ensure(params(cfg_path, name="bob", owner="bob"))
    assert again["phase"] in ("Stopped", None) and again["cloudvm"]["spec"]["powerState"] == "Stopped"
    host.ensure(params(cfg_path, name="bob", state="absent", delete_volume=True))
    assert records(cfg_path) == [] and not location.exists()
    with HostStore(json.loads(Path(cfg_path).read_text())["store_path"]) as s:
        assert s.get_volume("bob-root") is None


def test_stopping_a_vm_that_does_not_exist_says_so(cfg_path):
    with pytest.raises(CloudVMError, match="there is no CloudVM default/nobody; owner is required to create one"):
        host.ensure(params(cfg_path, name="nobody", power_state="stopped"))
    assert records(cfg_path) == []
