"""rbd_volume planning: refusals name the field and the culprit; an image in the desired state plans nothing."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import META_CLAIMED_BY, META_OWNER, MiB
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_volume_module import (
    Observed,
    VolumeRefused,
    plan_volume,
)

W = [{"address": "127.0.0.1:0/42", "client": 4198}]


def P(**kw):
    base = {"pool": "rbd", "name": "vm", "state": "present", "size_mib": None, "clone_from": None, "snapshot": None,
            "snapshot_state": "present", "owner": None, "claimed_by": None, "release_claim": False,
            "purge_snapshots": False, "allow_shrink": False}
    base.update(kw)
    return base


def test_create_sets_marks_and_snapshot():
    acts = plan_volume(P(size_mib=64, owner="bob", claimed_by="u1", snapshot="s", snapshot_state="protected"),
                       Observed(False))
    assert acts == [("create", 64), ("meta_set", META_OWNER, "bob"), ("meta_set", META_CLAIMED_BY, "u1"),
                    ("snap_create", "s"), ("snap_protect", "s")]


def test_desired_state_plans_nothing():
    obs = Observed(True, size=64 * MiB, snapshots={"s": True}, meta={META_OWNER: "bob", META_CLAIMED_BY: "u1"})
    assert plan_volume(P(size_mib=64, owner="bob", claimed_by="u1", snapshot="s", snapshot_state="protected"),
                       obs) == []


def test_owner_mismatch_is_refused():
    with pytest.raises(VolumeRefused, match="owner: 'eve' does not match the owner mark 'bob'"):
        plan_volume(P(owner="eve"), Observed(True, size=MiB, meta={META_OWNER: "bob"}))


def test_claim_by_another_vm_is_refused():
    with pytest.raises(VolumeRefused, match="claimed_by: 'u2' but rbd/vm is claimed by 'u1'"):
        plan_volume(P(claimed_by="u2"), Observed(True, size=MiB, meta={META_CLAIMED_BY: "u1"}))


def test_absent_refused_with_watchers_naming_them():
    with pytest.raises(VolumeRefused, match=r"has watchers 127\.0\.0\.1:0/42 \(client\.4198\)"):
        plan_volume(P(state="absent"), Observed(True, size=MiB, watchers=W))


def test_absent_refused_while_claimed_unless_released():
    obs = Observed(True, size=MiB, meta={META_CLAIMED_BY: "u1"})
    with pytest.raises(VolumeRefused, match="claimed by 'u1'"):
        plan_volume(P(state="absent"), obs)
    assert plan_volume(P(state="absent", release_claim=True, claimed_by="u1"), obs) == [("remove",)]


def test_absent_refused_with_snapshots_unless_purged():
    obs = Observed(True, size=MiB, snapshots={"a": True, "b": False})
    with pytest.raises(VolumeRefused, match="has snapshots a, b; set purge_snapshots"):
        plan_volume(P(state="absent"), obs)
    assert plan_volume(P(state="absent", purge_snapshots=True), obs) == [
        ("snap_unprotect", "a"), ("snap_purge",), ("remove",)]


def test_release_refused_while_watchers():
    obs = Observed(True, size=MiB, meta={META_CLAIMED_BY: "u1"}, watchers=W)
    with pytest.raises(VolumeRefused, match="still has watchers"):
        plan_volume(P(release_claim=True, claimed_by="u1"), obs)


def test_shrink_needs_allow_shrink_and_grow_does_not():
    obs = Observed(True, size=128 * MiB)
    with pytest.raises(VolumeRefused, match="size_mib: 64 is below the current size 128 MiB"):
        plan_volume(P(state="resized", size_mib=64), obs)
    assert plan_volume(P(state="resized", size_mib=64, allow_shrink=True), obs) == [("resize", 64, True)]
    assert plan_volume(P(size_mib=256), obs) == [("resize", 256, False)]


def test_clone_needs_a_protected_parent_snapshot():
    parent = Observed(True, size=64 * MiB, snapshots={"v1": False})
    with pytest.raises(VolumeRefused, match="not protected"):
        plan_volume(P(clone_from="rbd/tpl@v1"), Observed(False), parent)
    parent.snapshots["v1"] = True
    assert plan_volume(P(clone_from="rbd/tpl@v1"), Observed(False), parent) == [("clone", "rbd/tpl@v1")]


@pytest.mark.parametrize(("kw", "msg"), [
    ({"name": "-rf"}, "name: '-rf' is not a valid name"),
    ({"size_mib": 0}, "size_mib: 0 is outside the range"),
    ({"clone_from": "rbd/tpl"}, "must name a snapshot"),
    ({"owner": "a b"}, "owner: 'a b' must be"),
])
def test_bad_input_names_the_field(kw, msg):
    with pytest.raises((VolumeRefused, ValueError), match=msg):
        plan_volume(P(**kw), Observed(False))


CHILD = {"pool": "rbd", "pool_namespace": "", "image": "child1", "id": "10a1", "trash": False}


def test_clones_of_a_snapshot_refuse_absent_and_snapshot_removal_naming_them():
    obs = Observed(True, size=MiB, snapshots={"base": True, "other": False}, children={"base": [CHILD]})
    with pytest.raises(VolumeRefused, match=r"state: absent refused: snapshot rbd/vm@base has clones rbd/child1; "
                                            r"flatten each clone \(rbd flatten rbd/child1\)"):
        plan_volume(P(state="absent", purge_snapshots=True), obs)
    for want in ("absent", "unprotected"):
        with pytest.raises(VolumeRefused, match=f"snapshot_state: {want} refused: snapshot rbd/vm@base"):
            plan_volume(P(snapshot="base", snapshot_state=want), obs)
    assert plan_volume(P(snapshot="other", snapshot_state="absent"), obs) == [("snap_remove", "other")]
    obs.children = {}
    assert plan_volume(P(state="absent", purge_snapshots=True), obs) == [
        ("snap_unprotect", "base"), ("snap_purge",), ("remove",)]


def test_manual_lock_refuses_changes_but_not_reads_and_auto_locks_pass():
    lock = {"id": "maint", "locker": "client.7", "address": "127.0.0.1:0/9"}
    obs = Observed(True, size=MiB, snapshots={"s": False}, locks=[lock])
    with pytest.raises(VolumeRefused, match=r"rbd/vm is locked \('maint' held by client.7 .*rbd lock rm rbd/vm "
                                            r"'maint' client.7"):
        plan_volume(P(size_mib=2), obs)
    assert plan_volume(P(size_mib=1), obs) == []  # nothing to change: nothing refused
    obs.locks = [dict(lock, id="auto 1403")]
    assert plan_volume(P(size_mib=2), obs) == [("resize", 2, False)]


def test_missing_pool_is_refused_before_create():
    with pytest.raises(VolumeRefused, match="pool: 'rbd' does not exist"):
        plan_volume(P(size_mib=8), Observed(False, pool_exists=False))
