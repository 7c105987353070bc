"""Offline backup and restore of RBD images against a real Ceph cluster (module_utils.storage.backup_io with real
rbd)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import COMPLETE_FILE, DATA_FILE
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import run_backup_module
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef, MiB

from .conftest import read_image, write_at

pytestmark = pytest.mark.ceph
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def make_image(rbd, ceph_cluster, name, tmp, size_mib=64):
    ref = ImageRef("rbd", name)
    rbd.create(ref, size_mib)
    write_at(ceph_cluster, ref, 0, b"boot" * 4096, tmp)
    write_at(ceph_cluster, ref, 20 * MiB + 123, b"original file content" * 500, tmp)
    return ref


def test_full_then_incremental_backup_restore_into_new_images(rbd, ceph_cluster, image_name, tmp_path):
    dest = str(tmp_path / "bk")
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path))
    want1 = read_image(ceph_cluster, ref, str(tmp_path / "w1"))
    full = bio.backup(rbd, ref, dest, vm="alice", owner="alice")
    assert full["plan"]["type"] == "full"
    b1 = full["backup"]
    assert b1["vm"] == "alice" and b1["owner"] == "alice" and len(b1["blocks"]) == 16
    assert os.path.exists(os.path.join(dest, b1["id"], COMPLETE_FILE))
    write_at(ceph_cluster, ref, 20 * MiB + 123, b"CHANGED file content!" * 500, str(tmp_path))
    want2 = read_image(ceph_cluster, ref, str(tmp_path / "w2"))
    rbd.meta_set(ref, "cloud.zjusct.io/owner", "alice")  # the owner mark is recorded when no owner is given
    inc = bio.backup(rbd, ref, dest, vm="alice")
    b2 = inc["backup"]
    assert inc["plan"]["type"] == "diff" and b2["parent"] == b1["id"] and b2["chain"] == [b1["id"], b2["id"]]
    assert b2["dataBytes"] == 4 * MiB  # one 4 MiB object changed
    assert inc["removed_snapshots"] == [b1["snapshot"]]
    assert [s["name"] for s in rbd.snapshots(ref)] == [b2["snapshot"]]
    r1 = bio.restore(rbd, dest, ImageRef("rbd", image_name + "-r1"), b1["id"])
    r2 = bio.restore(rbd, dest, ImageRef("rbd", image_name + "-r2"))
    assert r1["verified_blocks"] == 16 and r2["backup_id"] == b2["id"]
    got1 = read_image(ceph_cluster, ImageRef("rbd", image_name + "-r1"), str(tmp_path / "g1"))
    got2 = read_image(ceph_cluster, ImageRef("rbd", image_name + "-r2"), str(tmp_path / "g2"))
    assert got1 == want1 and b"original file content" in got1
    assert got2 == want2 and b"CHANGED file content!" in got2
    assert rbd.snapshots(ImageRef("rbd", image_name + "-r2")) == []
    assert rbd.meta(ImageRef("rbd", image_name + "-r2"))["cloud.zjusct.io/owner"] == "alice"
    again = bio.restore(rbd, dest, ImageRef("rbd", image_name + "-r2"))
    assert not again["changed"]
    with pytest.raises(bio.BackupError, match="already exists; restore only into a new image"):
        bio.restore(rbd, dest, ref)


@pytest.mark.parametrize("kind", ["crc32c", "sha256"])
def test_corrupted_byte_makes_restore_refuse_naming_the_block(rbd, ceph_cluster, image_name, tmp_path, kind):
    dest = str(tmp_path / "bk")
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path))
    b = bio.backup(rbd, ref, dest, checksum=kind)["backup"]
    assert b.get("checksum", "sha256") == kind and len(b["blocks"][0]) == {"crc32c": 8, "sha256": 64}[kind]
    data = os.path.join(dest, b["id"], DATA_FILE)
    # the full stream holds whole 4 MiB objects in order: object 5 (20 MiB) carries the file content
    with open(data, "r+b") as f:
        blob = f.read()
        pos = blob.index(b"original file content") + 7
        f.seek(pos)
        f.write(bytes([blob[pos] ^ 0xFF]))
    target = ImageRef("rbd", image_name + "-bad")
    with pytest.raises(bio.BackupError) as err:
        bio.restore(rbd, dest, target)
    msg = str(err.value)
    assert f"backup {b['id']}: file {DATA_FILE} {kind}" in msg
    assert f"backup {b['id']}: image block 5 (offset 20 MiB" in msg
    assert rbd.info(target) is None, "a refused restore must not leave an image behind"
    _chain, problems = bio.verify_chain(dest, b["id"])
    assert {p.index for p in problems if p.where == "image"} == {5}


def test_case_V2_backup_refused_while_the_image_has_a_watcher(rbd, ceph_cluster, image_name, tmp_path, watcher):
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path), size_mib=24)
    watcher(ref)
    w = rbd.status(ref)[0]
    with pytest.raises(bio.BackupError, match=f"watchers: {w['address']} \\(client.{w['client']}\\)"):
        bio.backup(rbd, ref, str(tmp_path / "bk"))
    assert rbd.snapshots(ref) == [] and not os.path.exists(tmp_path / "bk" / ".lock")


def test_retention_keeps_needed_chain_and_deletes_the_rest(rbd, ceph_cluster, image_name, tmp_path):
    dest = str(tmp_path / "bk")
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path), size_mib=24)
    ids = []
    for i in range(4):
        write_at(ceph_cluster, ref, i * 4096, b"x%d" % i, str(tmp_path))
        res = bio.backup(rbd, ref, dest, keep=2, full_every=2)
        ids.append(res["backup"]["id"])
        types = res["plan"]["type"]
        assert types == ("full" if i % 2 == 0 else "diff")
        if i == 2:  # keep b3 and b2; b2 needs b1
            assert sorted(res["retention"]["keep"]) == sorted(ids[:3]) and res["retention"]["deleted"] == []
    assert sorted(res["retention"]["deleted"]) == sorted(ids[:2])
    assert sorted(n for n in os.listdir(dest) if not n.startswith(".")) == sorted(ids[2:])
    got = bio.restore(rbd, dest, ImageRef("rbd", image_name + "-r"))
    assert got["chain"] == ids[2:]


KILL_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import run_backup_module
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd
bio.backup(Rbd(Connection(conf=sys.argv[2])), ImageRef("rbd", sys.argv[3]), sys.argv[4])
"""


def test_killed_backup_leaves_nothing_complete_and_the_image_usable(rbd, ceph_cluster, image_name, tmp_path):
    dest = str(tmp_path / "bk")
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, 512)
    subprocess.run(["rbd", "-c", str(ceph_cluster.conf), "bench", "--io-type", "write", "--io-pattern", "seq",
                    "--io-size", "4M", "--io-total", "512M", ref.spec], check=True, capture_output=True,
                   timeout=600, env=ceph_cluster.env())
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, os.path.join(REPO, ".collections"),
                             str(ceph_cluster.conf), image_name, dest], env=ceph_cluster.env())
    try:
        deadline = time.monotonic() + 120
        killed = False
        while time.monotonic() < deadline and proc.poll() is None:
            parts = [n for n in os.listdir(dest)] if os.path.isdir(dest) else []
            partial = [n for n in parts if n.startswith(bio.PARTIAL_PREFIX)]
            data = os.path.join(dest, partial[0], DATA_FILE) if partial else None
            if data and os.path.exists(data) and os.path.getsize(data) > 8 * MiB:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.02)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert killed, "backup finished before it could be interrupted (image too small for this machine?)"
    complete, partial, _bad = bio.scan(dest)
    assert complete == [] and len(partial) == 1
    for root, _dirs, files in os.walk(dest):
        assert COMPLETE_FILE not in files, f"interrupted backup has a complete marker in {root}"
    # the image stays usable: no watcher left once the orphaned export ends, writes succeed
    deadline = time.monotonic() + 60
    while rbd.status(ref) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rbd.status(ref) == []
    write_at(ceph_cluster, ref, 0, b"after the crash", str(tmp_path))
    res = bio.backup(rbd, ref, dest)
    assert res["removed_partials"] == partial and res["plan"]["type"] == "full"
    assert [s["name"] for s in rbd.snapshots(ref)] == [res["backup"]["snapshot"]]
    assert json.loads(open(os.path.join(dest, res["backup"]["id"], "manifest.json")).read())["id"] == \
        res["backup"]["id"]


def test_two_destinations_each_keep_their_own_diff_base(rbd, ceph_cluster, image_name, tmp_path):
    """Issue input: one image backed up to two destinations (keep 7 and keep 4), 8 MiB written, backed up to both
    again: both new backups are diffs of the 8 MiB; neither run removes the other destination's snapshot."""
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path), size_mib=64)
    dests = {"local": (str(tmp_path / "local"), 7), "offsite": (str(tmp_path / "offsite"), 4)}

    def run(which):
        dest, keep = dests[which]
        return run_backup_module({"state": "present", "pool": "rbd", "name": image_name, "dest": dest,
                                  "keep": keep, "full_every": 7, "watcher_grace_seconds": 35}, rbd)

    def snaps():
        return {s["name"] for s in rbd.snapshots(ref)}

    first = {}
    for which in dests:
        first[which] = run(which)
        assert first[which]["type"] == "full"
    assert snaps() == {first["local"]["snapshot"], first["offsite"]["snapshot"]}
    assert first["local"]["dest_tag"] != first["offsite"]["dest_tag"]
    write_at(ceph_cluster, ref, 32 * MiB, os.urandom(8 * MiB), str(tmp_path))
    second = {}
    for which, other in (("local", "offsite"), ("offsite", "local")):
        second[which] = run(which)
        res = second[which]
        assert res["type"] == "diff", res["reason"]
        assert res["parent"] == first[which]["backup_id"]
        assert res["data_bytes"] == 8 * MiB and res["bytes_written"] < 9 * MiB  # two 4 MiB objects changed
        assert res["removed_snapshots"] == [first[which]["snapshot"]]
        assert res["snapshot"] == f"zjusct-backup-{res['dest_tag']}-{res['backup_id']}"
        other_base = (second[other] if other in second else first[other])["snapshot"]
        assert other_base in snaps(), f"the {which} run removed the {other} destination's diff base"
    assert snaps() == {second["local"]["snapshot"], second["offsite"]["snapshot"]}
    # a diff base deleted by hand: the next backup to that destination is full and says why; the other's survives
    gone = second["local"]["snapshot"]
    rbd.snap_remove(ref.at(gone))
    third = run("local")
    assert third["type"] == "full"
    assert third["reason"].startswith(f"snapshot {gone} of backup {second['local']['backup_id']} no longer exists "
                                      "on the image")
    assert snaps() == {third["snapshot"], second["offsite"]["snapshot"]}
    assert run("offsite")["type"] == "diff"


def test_snapshots_named_before_tags_stay_usable_and_are_cleaned_by_their_destination(rbd, ceph_cluster, image_name,
                                                                                      tmp_path, monkeypatch):
    """Migration: a backup whose snapshot is named zjusct-backup-<id> (earlier versions) is still a diff base;
    the next backup removes it (its manifest names it); an untagged snapshot of another destination stays."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_chain as bk

    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path), size_mib=24)
    dest = str(tmp_path / "bk")
    with monkeypatch.context() as m:  # the snapshot naming of earlier versions
        m.setattr(bio, "snapshot_name", lambda bid, tag=None: bk.snapshot_name(bid))
        old = bio.backup(rbd, ref, dest)["backup"]
    assert old["snapshot"] == "zjusct-backup-" + old["id"]
    foreign = "zjusct-backup-20200101T000000Z-abcdef"
    rbd.snap_create(ref.at(foreign))
    write_at(ceph_cluster, ref, 0, b"new", str(tmp_path))
    new = bio.backup(rbd, ref, dest)
    assert new["plan"]["type"] == "diff" and new["removed_snapshots"] == [old["snapshot"]]
    assert {s["name"] for s in rbd.snapshots(ref)} == {foreign, new["backup"]["snapshot"]}


def test_backup_made_before_crc32c_restores(rbd, ceph_cluster, image_name, tmp_path):
    """A sha256 chain (full + diff) written by the code before crc32c (tests/unit/rbd/fixtures/sha256-chain,
    see make_sha256_chain.py there) restores block-verified into new images, each member of the chain."""
    sys.path.insert(0, REPO)
    from tests.unit.rbd.diffgen import apply

    dest = str(tmp_path / "bk")
    shutil.copytree(os.path.join(REPO, "tests", "unit", "rbd", "fixtures", "sha256-chain"), dest)
    full_id, diff_id = "20261130T010000Z-a1b2c3", "20261130T020000Z-d4e5f6"
    size = 2 * 4 * MiB + 65536  # the records below are those make_sha256_chain.py wrote
    full = [("w", 0, b"written by the sha256 backup format\n" * 100), ("w", 4 * MiB + 100, bytes(range(256)) * 4)]
    diff = [("w", 8 * MiB, b"second backup, a diff\n" * 20), ("z", 4 * MiB + 100, 512)]
    want_full = bytes(apply(bytearray(), full, size))
    want_diff = bytes(apply(bytearray(want_full), diff, size))
    for bid, want, suffix in ((full_id, want_full, "-old1"), (diff_id, want_diff, "-old2")):
        target = ImageRef("rbd", image_name + suffix)
        res = bio.restore(rbd, dest, target, bid)
        assert res["changed"] and res["verified_blocks"] == 3 and res["owner"] == "alice"
        assert read_image(ceph_cluster, target, str(tmp_path / suffix)) == want


def test_a_sha256_chain_continues_in_sha256_and_the_next_full_is_crc32c(rbd, ceph_cluster, image_name, tmp_path):
    dest = str(tmp_path / "bk")
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path), size_mib=24)
    old = bio.backup(rbd, ref, dest, checksum="sha256")["backup"]  # a chain begun before crc32c
    assert "checksum" not in old and "sha256" in old["files"][0]
    write_at(ceph_cluster, ref, 8 * MiB, b"after the upgrade" * 100, str(tmp_path))
    want = read_image(ceph_cluster, ref, str(tmp_path / "w"))
    inc = bio.backup(rbd, ref, dest)
    assert inc["plan"]["type"] == "diff" and "checksum" not in inc["backup"], "a diff keeps its chain's kind"
    new_full = bio.backup(rbd, ref, dest, force_full=True)["backup"]
    assert new_full["checksum"] == "crc32c" and len(new_full["blocks"][0]) == 8
    for bid, suffix in ((inc["backup"]["id"], "-d"), (new_full["id"], "-f")):
        target = ImageRef("rbd", image_name + suffix)
        bio.restore(rbd, dest, target, bid)
        assert read_image(ceph_cluster, target, str(tmp_path / suffix)) == want


def test_restore_for_another_owner_is_refused_unless_an_operator_asks(rbd, ceph_cluster, image_name, tmp_path):
    """A backup is given only to its owner (case: a claim of another owner): naming oneself the owner of another
    tenant's backup creates nothing; the operator switch hands it over, with the new owner's mark."""
    dest = str(tmp_path / "bk")
    ref = make_image(rbd, ceph_cluster, image_name, str(tmp_path))
    b = bio.backup(rbd, ref, dest, vm="alice", owner="alice")["backup"]
    stolen = ImageRef("rbd", image_name + "-bob")
    params = {"state": "restored", "dest": dest, "pool": "rbd", "name": image_name, "target_name": stolen.image,
              "owner": "bob"}
    with pytest.raises(bio.BackupError, match=f"owner: 'bob' is not the owner 'alice' of backup {b['id']}"):
        run_backup_module(params, rbd)
    assert rbd.info(stolen) is None  # nothing created
    with pytest.raises(bio.BackupError, match="is not the owner 'alice'"):
        run_backup_module(params, rbd, check_mode=True)  # check mode predicts the refusal
    given = run_backup_module({**params, "operator": True}, rbd)
    assert given["changed"] and given["owner"] == "bob"
    assert rbd.meta(stolen)["cloud.zjusct.io/owner"] == "bob"
    own = run_backup_module({**params, "target_name": image_name + "-own", "owner": "alice"}, rbd)
    assert own["changed"] and rbd.meta(ImageRef("rbd", image_name + "-own"))["cloud.zjusct.io/owner"] == "alice"


def test_a_file_volume_backup_restores_as_an_rbd_image_and_back_into_a_file(rbd, ceph_cluster, image_name,
                                                                            tmp_path):
    """Across drivers: a file volume's full + incremental chain (written by file_backup, not by rbd) is restored
    into a new RBD image by rbd import-diff, every block verified; that image's own RBD backup restores into a new
    sparse file equal to the original volume."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage import file_backup as fb

    vol = tmp_path / "v.raw"
    with open(vol, "wb") as f:
        f.truncate(40 * MiB)
        f.seek(4 * MiB)
        f.write(os.urandom(3 * MiB))
        f.seek(21 * MiB)
        f.write(b"original file content" * 500)
    file_dest = str(tmp_path / "file-bk")
    fb.backup_volume(str(vol), "raw", file_dest, owner="alice")
    with open(vol, "r+b") as f:
        f.seek(21 * MiB)
        f.write(b"CHANGED file content!" * 500)
        f.seek(36 * MiB)
        f.write(b"a new block")
    inc = fb.backup_volume(str(vol), "raw", file_dest, owner="alice")
    assert inc["plan"]["type"] == "diff"
    want = vol.read_bytes()
    moved = ImageRef("rbd", image_name + "-moved")
    res = bio.restore(rbd, file_dest, moved)
    assert res["verified_blocks"] == 10 and res["chain"] == inc["backup"]["chain"]
    assert read_image(ceph_cluster, moved, str(tmp_path / "m")) == want
    assert rbd.meta(moved)["cloud.zjusct.io/owner"] == "alice"
    # and back: the image's RBD backup (export-diff) into a file volume
    rbd_dest = str(tmp_path / "rbd-bk")
    bio.backup(rbd, moved, rbd_dest)
    back = fb.restore_volume(rbd_dest, str(tmp_path / "back.raw"))
    assert back["verified_blocks"] == 10 and (tmp_path / "back.raw").read_bytes() == want
    qcow = fb.restore_volume(rbd_dest, str(tmp_path / "back.qcow2"), "qcow2")
    assert qcow["verified_blocks"] == 10
    subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(tmp_path / "back.qcow2"),
                    str(tmp_path / "seen.raw")], check=True, timeout=300)
    assert (tmp_path / "seen.raw").read_bytes() == want


RESTORE_KILL_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd
bio.restore(Rbd(Connection(conf=sys.argv[2])), sys.argv[3], ImageRef("rbd", sys.argv[4]))
"""


def test_a_restore_killed_during_the_import_leaves_no_image_under_the_targets_name(rbd, ceph_cluster, image_name,
                                                                                   tmp_path):
    """SIGKILL while rbd import-diff writes the new image: the target name does not exist (the image is written as
    <target>.restoring-<random> and renamed only when verified); the next restore removes the leftover."""
    dest = str(tmp_path / "bk")
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, 256)
    subprocess.run(["rbd", "-c", str(ceph_cluster.conf), "bench", "--io-type", "write", "--io-pattern", "seq",
                    "--io-size", "4M", "--io-total", "256M", ref.spec], check=True, capture_output=True,
                   timeout=600, env=ceph_cluster.env())
    bio.backup(rbd, ref, dest)
    target = image_name + "-r"
    proc = subprocess.Popen([sys.executable, "-c", RESTORE_KILL_SCRIPT, os.path.join(REPO, ".collections"),
                             str(ceph_cluster.conf), dest, target], env=ceph_cluster.env())
    killed = False
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            temps = [n for n in rbd.ls("rbd") if n.startswith(target + bio.RESTORING)]
            if temps and rbd.status(ImageRef("rbd", temps[0])):  # rbd import-diff has it open: importing
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert killed, "the restore finished before it could be interrupted"
    assert target not in rbd.ls("rbd")
    [leftover] = [n for n in rbd.ls("rbd") if n.startswith(target + bio.RESTORING)]
    deadline = time.monotonic() + 90  # the orphaned import-diff's watch goes when it ends (or Ceph expires it)
    while rbd.status(ImageRef("rbd", leftover)) and time.monotonic() < deadline:
        time.sleep(0.5)
    done = bio.restore(rbd, dest, ImageRef("rbd", target))
    assert done["removed_leftovers"] == [leftover] and done["verified_blocks"] == 64
    assert [n for n in rbd.ls("rbd") if n.startswith(target)] == [target]
