"""Local-file parts of backup I/O (no Ceph): streamed hashing, the complete marker, damage naming on replay."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil

import google_crc32c
import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    COMPLETE_FILE,
    MANIFEST_FILE,
    FileEntry,
    Manifest,
    ManifestError,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import BLOCK_SIZE, HAS_CRC32C

from .diffgen import apply, diff_stream

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


class BrokenSink:
    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")


def test_copy_hashed_equals_sha256_and_copies_every_byte():
    data = os.urandom(3 * 1024 * 1024 + 17)
    out = io.BytesIO()
    size, sha = bio.copy_hashed(io.BytesIO(data), out)
    assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest()) and out.getvalue() == data


def test_a_failing_sink_surfaces_its_error():
    with pytest.raises(BrokenPipeError):
        bio.copy_hashed(io.BytesIO(b"x" * (8 * 1024 * 1024)), BrokenSink())


def write_backup(dest, stream: bytes, size: int) -> Manifest:
    bid = "20261130T000000Z-00000a"
    os.makedirs(os.path.join(dest, bid))
    with open(os.path.join(dest, bid, "data.rbdiff"), "wb") as f:
        f.write(stream)
    _reader, state, (n, sha, _c) = bio.consume_diff(io.BytesIO(stream), None, None)
    blocks, _unknown = state.finish()
    m = Manifest(id=bid, seq=1, created_at="2026-11-30T00:00:00Z", type="full", pool="rbd", image="vm",
                 image_id="i", image_size=size, snapshot="zjusct-backup-" + bid, parent=None, from_snapshot=None,
                 chain=[bid], files=[FileEntry("data.rbdiff", n, sha)], blocks=[str(b) for b in blocks])
    raw = json.dumps(m.to_dict()).encode()
    with open(os.path.join(dest, bid, MANIFEST_FILE), "wb") as f:
        f.write(raw)
    with open(os.path.join(dest, bid, COMPLETE_FILE), "w") as f:
        f.write(hashlib.sha256(raw).hexdigest())
    return m


def _flip_second_record_and_verify(tmp_path, backup_id: str, from_end: int, checksum: str) -> None:
    """Flip one bit ``from_end`` bytes before the end of the backup's data file (inside its second record, image
    block 2) and check that verification names block 2 and the file's ``checksum``."""
    path = tmp_path / backup_id / "data.rbdiff"
    blob = bytearray(path.read_bytes())
    blob[len(blob) - from_end] ^= 1
    path.write_bytes(bytes(blob))
    _chain, problems = bio.verify_chain(str(tmp_path), None)
    assert [p.index for p in problems if p.where == "image"] == [2]
    assert any(f"file data.rbdiff {checksum}" in p.message for p in problems)


def test_verify_names_the_block_a_flipped_byte_lands_in(tmp_path):
    size = 4 * BLOCK_SIZE
    stream = diff_stream([("w", 0, b"a" * BLOCK_SIZE), ("w", 2 * BLOCK_SIZE, b"c" * BLOCK_SIZE)], size=size)
    m = write_backup(str(tmp_path), stream, size)
    assert bio.verify_chain(str(tmp_path), None)[1] == []
    _flip_second_record_and_verify(tmp_path, m.id, 100, "sha256")


def test_scan_ignores_partial_and_tampered_backups(tmp_path):
    m = write_backup(str(tmp_path), diff_stream([], size=BLOCK_SIZE), BLOCK_SIZE)
    os.makedirs(tmp_path / ".partial-20261130T000001Z-00000b")
    assert [x.id for x in bio.scan(str(tmp_path))[0]] == [m.id]
    with open(tmp_path / m.id / MANIFEST_FILE, "a") as f:
        f.write(" ")
    complete, partial, bad = bio.scan(str(tmp_path))
    assert complete == [] and partial == [".partial-20261130T000001Z-00000b"]
    assert "does not match" in bad[0]


def test_crc32c_is_the_default_where_requirements_txt_is_installed():
    assert HAS_CRC32C and bio.default_checksum() == "crc32c"


def test_copy_hashed_crc32c_equals_google_crc32c():
    data = os.urandom(3 * 1024 * 1024 + 17)
    out = io.BytesIO()
    size, crc = bio.copy_hashed(io.BytesIO(data), out, "crc32c")
    assert (size, crc) == (len(data), f"{google_crc32c.value(data):08x}") and out.getvalue() == data


def copy_fixture(name, dest):
    shutil.copytree(os.path.join(FIXTURES, name), dest)
    return dest


def test_backup_written_by_the_sha256_format_still_verifies_and_names_damage(tmp_path):
    """tests/unit/rbd/fixtures/sha256-chain was written by the code before crc32c (commit 5dd2eb7, see
    make_sha256_chain.py): a full and a diff, manifests without ``checksum``, ``files[].sha256``."""
    dest = copy_fixture("sha256-chain", str(tmp_path / "bk"))
    chain, problems = bio.verify_chain(dest, None)
    assert problems == [] and [m.checksum for m in chain] == ["sha256", "sha256"] and len(chain) == 2
    assert chain[1].files[0].digest == hashlib.sha256(
        (tmp_path / "bk" / chain[1].id / "data.rbdiff").read_bytes()).hexdigest()
    # re-serialising an old manifest gives the old shape back byte for byte (no checksum key)
    raw = (tmp_path / "bk" / chain[0].id / MANIFEST_FILE).read_bytes()
    assert json.dumps(chain[0].to_dict(), indent=1, sort_keys=True).encode() == raw
    path = tmp_path / "bk" / chain[0].id / "data.rbdiff"
    blob = bytearray(path.read_bytes())
    blob[200] ^= 1  # inside the first write record: image block 0
    path.write_bytes(bytes(blob))
    _chain, problems = bio.verify_chain(dest, chain[0].id)
    assert [p.index for p in problems if p.where == "image"] == [0]
    assert any("file data.rbdiff sha256" in p.message for p in problems)


def test_crc32c_manifest_round_trips_and_verify_names_the_damaged_block(tmp_path):
    size = 3 * BLOCK_SIZE + 4096
    recs = [("w", 0, b"a" * BLOCK_SIZE), ("w", 2 * BLOCK_SIZE + 5, b"c" * 1000)]
    stream = diff_stream(recs, size=size)
    bid = "20261130T000000Z-00000c"
    os.makedirs(tmp_path / bid)
    (tmp_path / bid / "data.rbdiff").write_bytes(stream)
    _r, state, (n, crc, _c) = bio.consume_diff(io.BytesIO(stream), None, None, checksum="crc32c")
    blocks, unknown = state.finish()
    img = apply(bytearray(), recs, size)
    assert unknown == [] and crc == f"{google_crc32c.value(stream):08x}"
    assert blocks == [f"{google_crc32c.value(bytes(img[i:i + BLOCK_SIZE])):08x}" for i in range(0, size, BLOCK_SIZE)]
    m = Manifest(id=bid, seq=1, created_at="2026-11-30T00:00:00Z", type="full", pool="rbd", image="vm",
                 image_id="i", image_size=size, snapshot="zjusct-backup-" + bid, parent=None, from_snapshot=None,
                 chain=[bid], files=[FileEntry("data.rbdiff", n, crc)], blocks=[str(b) for b in blocks],
                 checksum="crc32c")
    d = m.to_dict()
    assert d["checksum"] == "crc32c" and d["files"][0]["crc32c"] == crc and "sha256" not in d["files"][0]
    assert Manifest.from_dict(json.loads(json.dumps(d))) == m
    raw = json.dumps(d).encode()
    (tmp_path / bid / MANIFEST_FILE).write_bytes(raw)
    (tmp_path / bid / COMPLETE_FILE).write_text(hashlib.sha256(raw).hexdigest())
    assert bio.verify_chain(str(tmp_path), None)[1] == []
    _flip_second_record_and_verify(tmp_path, bid, 300, "crc32c")


def test_a_chain_mixing_checksum_kinds_is_refused_by_name(tmp_path):
    dest = copy_fixture("sha256-chain", str(tmp_path / "bk"))
    complete = bio.scan(dest)[0]
    diff = max(complete, key=lambda m: m.seq)
    d = diff.to_dict()
    d["checksum"] = "crc32c"
    d["files"][0]["crc32c"] = "0badc0de"
    del d["files"][0]["sha256"]
    d["blocks"] = ["00000000"] * len(d["blocks"])
    raw = json.dumps(d).encode()
    (tmp_path / "bk" / diff.id / MANIFEST_FILE).write_bytes(raw)
    (tmp_path / "bk" / diff.id / COMPLETE_FILE).write_text(hashlib.sha256(raw).hexdigest())
    with pytest.raises(bio.BackupError, match=f"backup {diff.id}: checksum crc32c differs from sha256"):
        bio.verify_chain(dest, None)


def test_manifest_with_an_unknown_checksum_kind_is_named(tmp_path):
    dest = copy_fixture("sha256-chain", str(tmp_path / "bk"))
    m = bio.scan(dest)[0][0]
    d = m.to_dict()
    d["checksum"] = "md5"
    with pytest.raises(ManifestError, match="manifest checksum: 'md5', expected one of sha256, crc32c"):
        Manifest.from_dict(d)
