"""zjusct.cloud.rbd_volume against a real Ceph cluster (run function with the real rbd CLI)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef, MiB
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_volume_module import VolumeRefused, run_volume

from .conftest import read_image, write_at

pytestmark = pytest.mark.ceph


def P(name: str, **kw):
    base = {"pool": "rbd", "name": name, "state": "present", "size_mib": None, "allow_shrink": False,
            "clone_from": None, "snapshot": None, "snapshot_state": "present", "from_snapshot": None,
            "export_format": None, "path": None, "diffs": [], "force": False, "owner": None, "claimed_by": None,
            "release_claim": False, "purge_snapshots": False}
    base.update(kw)
    return base


def test_create_is_idempotent_and_reports_marks(rbd, image_name):
    res = run_volume(P(image_name, size_mib=64, owner="alice", claimed_by="uid-1"), rbd)
    assert res["changed"] and res["image"]["size_mib"] == 64
    assert res["image"]["owner"] == "alice" and res["image"]["claimed_by"] == "uid-1"
    assert "exclusive-lock" in res["image"]["features"] and res["image"]["watchers"] == []
    again = run_volume(P(image_name, size_mib=64, owner="alice", claimed_by="uid-1"), rbd)
    assert not again["changed"] and again["actions"] == []
    assert rbd.meta(ImageRef("rbd", image_name))["cloud.zjusct.io/owner"] == "alice"


def test_check_mode_creates_nothing(rbd, image_name):
    res = run_volume(P(image_name, size_mib=64, snapshot="s1"), rbd, check_mode=True)
    assert res["changed"] and res["actions"] == ["create 64", "snap_create s1"]
    assert res["diff"]["after"]["exists"] and not res["diff"]["before"]["exists"]
    assert rbd.info(ImageRef("rbd", image_name)) is None
    assert image_name not in rbd.ls("rbd")


def test_clone_from_protected_template_then_grow_and_shrink_rules(rbd, image_name):
    tpl = image_name + "-tpl"
    run_volume(P(tpl, size_mib=32, snapshot="v1", snapshot_state="protected"), rbd)
    with pytest.raises(VolumeRefused, match="not protected"):
        run_volume(P(tpl, snapshot="v2"), rbd)  # create v2 unprotected
        run_volume(P(image_name, clone_from=f"rbd/{tpl}@v2"), rbd)
    res = run_volume(P(image_name, clone_from=f"rbd/{tpl}@v1", size_mib=64), rbd)
    assert res["image"]["parent"] == f"rbd/{tpl}@v1" and res["image"]["size_mib"] == 64
    assert not run_volume(P(image_name, clone_from=f"rbd/{tpl}@v1", size_mib=64), rbd)["changed"]
    with pytest.raises(VolumeRefused, match="size_mib: 16 is below the current size 64 MiB"):
        run_volume(P(image_name, state="resized", size_mib=16), rbd)
    assert run_volume(P(image_name, state="resized", size_mib=16, allow_shrink=True), rbd)["image"]["size_mib"] == 16
    assert run_volume(P(image_name, state="resized", size_mib=128), rbd)["image"]["size_mib"] == 128


def test_snapshot_states(rbd, image_name):
    run_volume(P(image_name, size_mib=8), rbd)
    assert run_volume(P(image_name, snapshot="a", snapshot_state="protected"), rbd)["changed"]
    snaps = run_volume(P(image_name, snapshot="a", snapshot_state="protected"), rbd)["image"]["snapshots"]
    assert [(s["name"], s["protected"]) for s in snaps] == [("a", True)]
    res = run_volume(P(image_name, snapshot="a", snapshot_state="absent"), rbd)
    assert res["actions"] == ["snap_unprotect a", "snap_remove a"] and res["image"]["snapshots"] == []


def test_case_V2_absent_refused_while_a_watcher_exists_and_names_it(rbd, image_name, watcher):
    run_volume(P(image_name, size_mib=8), rbd)
    watcher(ImageRef("rbd", image_name))
    w = rbd.status(ImageRef("rbd", image_name))[0]
    with pytest.raises(VolumeRefused, match=f"has watchers {w['address']} \\(client.{w['client']}\\)"):
        run_volume(P(image_name, state="absent"), rbd)
    assert rbd.info(ImageRef("rbd", image_name)) is not None


def test_absent_refused_while_claimed_or_with_snapshots_then_allowed(rbd, image_name):
    run_volume(P(image_name, size_mib=8, claimed_by="uid-1", snapshot="s", snapshot_state="protected"), rbd)
    with pytest.raises(VolumeRefused, match="claimed by 'uid-1'"):
        run_volume(P(image_name, state="absent", purge_snapshots=True), rbd)
    with pytest.raises(VolumeRefused, match="has snapshots s"):
        run_volume(P(image_name, state="absent", release_claim=True, claimed_by="uid-1"), rbd)
    res = run_volume(P(image_name, state="absent", release_claim=True, claimed_by="uid-1", purge_snapshots=True), rbd)
    assert res["changed"] and res["image"] is None
    assert not run_volume(P(image_name, state="absent"), rbd)["changed"]


def test_ownership_mismatch_is_refused_and_changes_nothing(rbd, image_name):
    run_volume(P(image_name, size_mib=8, owner="alice", claimed_by="uid-1"), rbd)
    with pytest.raises(VolumeRefused, match="owner: 'mallory' does not match the owner mark 'alice'"):
        run_volume(P(image_name, size_mib=16, owner="mallory"), rbd)
    with pytest.raises(VolumeRefused, match="claimed by 'uid-1'"):
        run_volume(P(image_name, claimed_by="uid-2"), rbd)
    assert rbd.info(ImageRef("rbd", image_name))["size"] == 8 * MiB


def test_export_full_and_diff_then_import_chain_into_new_image(rbd, image_name, ceph_cluster, tmp_path):
    ref = ImageRef("rbd", image_name)
    run_volume(P(image_name, size_mib=16), rbd)
    write_at(ceph_cluster, ref, 4096, b"first" * 1000, str(tmp_path))
    run_volume(P(image_name, snapshot="s1"), rbd)
    write_at(ceph_cluster, ref, 9 * MiB, b"second" * 1000, str(tmp_path))
    run_volume(P(image_name, snapshot="s2"), rbd)
    full, diff = str(tmp_path / "full.raw"), str(tmp_path / "s1-s2.rbdiff")
    assert run_volume(P(image_name, state="exported", snapshot="s1", path=full), rbd)["changed"]
    assert not run_volume(P(image_name, state="exported", snapshot="s1", path=full), rbd)["changed"]
    run_volume(P(image_name, state="exported", snapshot="s2", from_snapshot="s1", path=diff), rbd)
    # a raw full export has no snapshot to diff from: use the diff format for the base of a chain
    base = str(tmp_path / "s1.rbdiff")
    run_volume(P(image_name, state="exported", snapshot="s1", export_format="diff", path=base), rbd)
    new = image_name + "-imp"
    res = run_volume(P(new, state="imported", path=base, diffs=[diff]), rbd)
    assert res["changed"]
    assert not run_volume(P(new, state="imported", path=base, diffs=[diff]), rbd)["changed"]
    want = read_image(ceph_cluster, ref.at("s2"), str(tmp_path / "want"))
    got = read_image(ceph_cluster, ImageRef("rbd", new), str(tmp_path / "got"))
    assert got == want and b"second" * 1000 in got
    raw_new = image_name + "-raw"
    run_volume(P(raw_new, state="imported", path=full), rbd)
    assert read_image(ceph_cluster, ImageRef("rbd", raw_new), str(tmp_path / "got2")) == \
        read_image(ceph_cluster, ref.at("s1"), str(tmp_path / "want2"))
    with pytest.raises(VolumeRefused, match="already exists; import only into a new image"):
        run_volume(P(image_name, state="imported", path=full), rbd)


def test_absent_of_a_template_with_a_clone_is_refused_alike_in_check_mode_and_for_real(rbd, image_name,
                                                                                       ceph_cluster):
    """Issue input: image tmpl, protected snapshot base, clone child1; state=absent purge_snapshots=true."""
    tmpl, child = image_name + "-tmpl", image_name + "-child1"
    tref = ImageRef("rbd", tmpl)
    run_volume(P(tmpl, size_mib=16, snapshot="base", snapshot_state="protected"), rbd)
    run_volume(P(child, clone_from=f"rbd/{tmpl}@base"), rbd)
    before = (rbd.info(tref), rbd.snapshots(tref), rbd.info(ImageRef("rbd", child)))
    want = (f"state: absent refused: snapshot rbd/{tmpl}@base has clones rbd/{child}; "
            f"flatten each clone \\(rbd flatten rbd/{child}\\) or delete it, then retry")
    for check_mode in (True, False):
        with pytest.raises(VolumeRefused, match=want):
            run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd, check_mode=check_mode)
        assert (rbd.info(tref), rbd.snapshots(tref), rbd.info(ImageRef("rbd", child))) == before
    # the same for the snapshot alone
    for state in ("absent", "unprotected"):
        with pytest.raises(VolumeRefused, match=f"snapshot_state: {state} refused: snapshot rbd/{tmpl}@base "
                                                f"has clones rbd/{child}"):
            run_volume(P(tmpl, snapshot="base", snapshot_state=state), rbd, check_mode=True)
    rbd.run(["flatten", f"rbd/{child}", "--no-progress"], json_out=False)
    planned = run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd, check_mode=True)
    assert planned["actions"] == ["snap_unprotect base", "snap_purge", "remove"]
    res = run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd)
    assert res["changed"] and res["actions"] == planned["actions"] and res["image"] is None
    assert rbd.info(tref) is None and "parent" not in rbd.info(ImageRef("rbd", child))
    again = run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd)
    assert not again["changed"] and again["actions"] == []


def test_a_trashed_clone_still_blocks_and_is_named(rbd, image_name):
    tmpl, child = image_name + "-tmpl", image_name + "-gone"
    run_volume(P(tmpl, size_mib=8, snapshot="base", snapshot_state="protected"), rbd)
    run_volume(P(child, clone_from=f"rbd/{tmpl}@base"), rbd)
    child_id = rbd.info(ImageRef("rbd", child))["id"]
    rbd.run(["trash", "mv", f"rbd/{child}"], json_out=False)
    with pytest.raises(VolumeRefused, match=f"has clones rbd/{child} \\(in the trash, id {child_id}\\); purge the "
                                            f"trashed clones \\(rbd trash rm rbd/{child_id}\\)"):
        run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd)
    rbd.run(["trash", "rm", f"rbd/{child_id}", "--no-progress"], json_out=False)
    assert run_volume(P(tmpl, state="absent", purge_snapshots=True), rbd)["image"] is None


def test_a_manual_lock_refuses_changes_before_any_is_made(rbd, image_name):
    """A lock taken with `rbd lock add` makes resize/snap/meta fail with EROFS and `rbd rm` hang (measured)."""
    ref = ImageRef("rbd", image_name)
    run_volume(P(image_name, size_mib=8), rbd)
    rbd.run(["lock", "add", ref.spec, "maint"], json_out=False)
    lk = rbd.locks(ref)[0]
    for kw in ({"state": "absent"}, {"size_mib": 16}, {"snapshot": "s1"}, {"owner": "alice"}):
        for check_mode in (True, False):
            with pytest.raises(VolumeRefused, match=f"rbd/{image_name} is locked \\('maint' held by "
                                                    f"{lk['locker']}.*rbd lock rm rbd/{image_name} 'maint' "
                                                    f"{lk['locker']}"):
                run_volume(P(image_name, **kw), rbd, check_mode=check_mode)
    assert rbd.info(ref)["size"] == 8 * MiB and rbd.snapshots(ref) == [] and rbd.meta(ref) == {}
    rbd.run(["lock", "rm", ref.spec, "maint", lk["locker"]], json_out=False)
    assert run_volume(P(image_name, state="absent"), rbd)["image"] is None


def test_missing_pool_and_files_are_refused_in_check_mode_too(rbd, image_name, tmp_path):
    for check_mode in (True, False):
        with pytest.raises(VolumeRefused, match="pool: 'nosuchpool' does not exist"):
            run_volume(P(image_name, pool="nosuchpool", size_mib=8), rbd, check_mode=check_mode)
        with pytest.raises(VolumeRefused, match=r"path: .*missing\.rbdiff' is not an existing file to import"):
            run_volume(P(image_name, state="imported", path=str(tmp_path / "missing.rbdiff")), rbd,
                       check_mode=check_mode)
    assert rbd.info(ImageRef("rbd", image_name)) is None
    run_volume(P(image_name, size_mib=8, snapshot="s"), rbd)
    with pytest.raises(VolumeRefused, match=r"its directory .*/nodir does not exist"):
        run_volume(P(image_name, state="exported", snapshot="s", path=str(tmp_path / "nodir" / "x.raw")), rbd,
                   check_mode=True)
