"""Pure backup decisions: full vs diff, retention that never breaks a chain, chain resolution, damage naming."""

from __future__ import annotations

import hashlib
import os

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    BLOCK_SIZE,
    FileEntry,
    Manifest,
    ManifestError,
    compare_blocks,
    compare_file,
    dest_tag,
    plan_backup,
    plan_retention,
    resolve_chain,
    snapshot_name,
    stale_snapshots,
)

H = hashlib.sha256(b"x").hexdigest()


def mk(seq: int, parent: Manifest | None = None, image_id: str = "img1", size: int = 2 * BLOCK_SIZE) -> Manifest:
    bid = f"20261130T0000{seq:02d}Z-{seq:06x}"
    chain = [*parent.chain, bid] if parent else [bid]
    return Manifest(id=bid, seq=seq, created_at="2026-11-30T00:00:00Z", type="diff" if parent else "full",
                    pool="rbd", image="vm", image_id=image_id, image_size=size, snapshot=snapshot_name(bid),
                    parent=parent.id if parent else None, from_snapshot=parent.snapshot if parent else None,
                    chain=chain, files=[FileEntry("data.rbdiff", 10, H, [H], BLOCK_SIZE)],
                    blocks=[H] * (size // BLOCK_SIZE))


def test_first_backup_is_full():
    plan = plan_backup([], "img1", BLOCK_SIZE, [])
    assert plan.type == "full" and plan.seq == 1 and "no earlier" in plan.reason


def test_diff_when_previous_snapshot_exists_on_the_image():
    a = mk(1)
    plan = plan_backup([a], "img1", 2 * BLOCK_SIZE, [a.snapshot])
    assert (plan.type, plan.parent, plan.from_snapshot, plan.chain, plan.seq) == ("diff", a.id, a.snapshot, [a.id], 2)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"source_snapshots": []}, "no longer exists"),
    ({"image_id": "other"}, "no earlier"),
    ({"force_full": True}, "force_full"),
    ({"full_every": 1}, "full_every=1"),
    ({"image_size": BLOCK_SIZE}, "shrank"),
])
def test_full_when_a_diff_would_be_unsafe(kwargs, why):
    a = mk(1)
    args = {"image_id": "img1", "image_size": 2 * BLOCK_SIZE, "source_snapshots": [a.snapshot], **kwargs}
    plan = plan_backup([a], **args)
    assert plan.type == "full" and why in plan.reason


def test_full_every_bounds_chain_length():
    a = mk(1)
    b = mk(2, a)
    c = mk(3, b)
    assert plan_backup([a, b, c], "img1", 2 * BLOCK_SIZE, [c.snapshot], full_every=3).type == "full"
    assert plan_backup([a, b, c], "img1", 2 * BLOCK_SIZE, [c.snapshot], full_every=4).type == "diff"


def test_retention_keeps_the_chain_a_kept_diff_needs():
    a = mk(1)
    b = mk(2, a)
    c = mk(3, b)
    d = mk(4)  # new full
    e = mk(5, d)
    plan = plan_retention([a, b, c, d, e], keep=2)
    assert plan.keep == [e.id, d.id] and plan.delete == [c.id, b.id, a.id]
    plan = plan_retention([a, b, c, d, e], keep=3)
    assert set(plan.keep) == {a.id, b.id, c.id, d.id, e.id} and plan.delete == []
    assert plan.kept_for_chain == [b.id, a.id]


def test_retention_never_deletes_the_newest():
    with pytest.raises(ValueError, match="keep: 0 is below the minimum 1"):
        plan_retention([mk(1)], keep=0)


def test_stale_snapshots_keep_only_the_next_diff_base_and_foreign_snapshots():
    a, b = mk(1), mk(2)  # named before tags existed: owned through this destination's manifests
    assert stale_snapshots([a.snapshot, b.snapshot, "user-snap"], b, "0badc0de", [a.snapshot, b.snapshot]) == \
        [a.snapshot]


def test_stale_snapshots_never_list_another_destinations_snapshots():
    mine_old, mine_new = snapshot_name("20261130T000001Z-000001", "aaaa1111"), \
        snapshot_name("20261130T000002Z-000002", "aaaa1111")
    theirs = snapshot_name("20261130T000003Z-000003", "bbbb2222")
    untagged_theirs = snapshot_name("20261130T000004Z-000004")
    assert mine_new == "zjusct-backup-aaaa1111-20261130T000002Z-000002"
    snaps = [mine_old, mine_new, theirs, untagged_theirs, "user-snap"]
    latest_mine = Manifest.__new__(Manifest)
    latest_mine.snapshot = mine_new
    assert stale_snapshots(snaps, latest_mine, "aaaa1111") == [mine_old]
    assert stale_snapshots(snaps, None, "bbbb2222") == [theirs]


def test_dest_tag_is_stable_for_one_directory_however_spelled(tmp_path):
    (tmp_path / "bk").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "bk")
    tag = dest_tag(str(tmp_path / "bk"))
    assert len(tag) == 8 and int(tag, 16) >= 0
    assert dest_tag(str(tmp_path / "link")) == tag == dest_tag(str(tmp_path / "bk") + "/./")
    assert tag == hashlib.sha256(os.path.realpath(tmp_path / "bk").encode()).hexdigest()[:8]
    assert dest_tag(str(tmp_path / "other")) != tag


def test_resolve_chain_orders_from_full_and_names_missing_members():
    a = mk(1)
    b = mk(2, a)
    c = mk(3, b)
    assert [m.id for m in resolve_chain([c, a, b], None)] == [a.id, b.id, c.id]
    assert [m.id for m in resolve_chain([c, a, b], b.id)] == [a.id, b.id]
    with pytest.raises(ValueError, match=f"chain member {b.id} is missing"):
        resolve_chain([a, c], c.id)
    with pytest.raises(ValueError, match="backup_id: 'nope' is not a complete backup"):
        resolve_chain([a], "nope")


def test_manifest_round_trips_and_rejects_inconsistency():
    a = mk(1)
    b = mk(2, a)
    assert Manifest.from_dict(b.to_dict()) == b
    bad = b.to_dict()
    bad["blocks"] = bad["blocks"][:1]
    with pytest.raises(ManifestError, match="manifest blocks: 1 checksums"):
        Manifest.from_dict(bad)
    bad = b.to_dict()
    bad["parent"] = None
    with pytest.raises(ManifestError, match="manifest parent"):
        Manifest.from_dict(bad)


def test_compare_file_names_the_damaged_chunk_and_byte_range():
    entry = FileEntry("data.rbdiff", 3 * BLOCK_SIZE, "f" * 64, ["a" * 64, "b" * 64, "c" * 64], BLOCK_SIZE)
    probs = compare_file("B1", entry, 3 * BLOCK_SIZE, "0" * 64, ["a" * 64, "X" * 64, "c" * 64])
    assert len(probs) == 1 and probs[0].index == 1
    assert f"chunk 1 (bytes {BLOCK_SIZE}-{2 * BLOCK_SIZE - 1})" in probs[0].message


def test_compare_blocks_names_the_block_and_offset():
    probs = compare_blocks("B1", ["a" * 64] * 4, ["a" * 64, None, "a" * 64, "d" * 64])
    assert [p.index for p in probs] == [3]
    assert "block 3 (offset 12 MiB" in probs[0].message
