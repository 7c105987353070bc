"""Local-file parts of backup I/O (no Ceph): streamed hashing, the complete marker, damage naming on replay."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils import _backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils._backup import (
    COMPLETE_FILE,
    MANIFEST_FILE,
    FileEntry,
    Manifest,
)
from ansible_collections.zjusct.cloud.plugins.module_utils._rbd_diff import BLOCK_SIZE

from .diffgen import diff_stream


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


def test_verify_names_the_block_a_flipped_byte_lands_in(tmp_path):
    size = 4 * BLOCK_SIZE
    stream = diff_stream([("w", 0, b"a" * BLOCK_SIZE), ("w", 2 * BLOCK_SIZE, b"c" * BLOCK_SIZE)], size=size)
    m = write_backup(str(tmp_path), stream, size)
    assert bio.verify_chain(str(tmp_path), None)[1] == []
    path = tmp_path / m.id / "data.rbdiff"
    blob = bytearray(path.read_bytes())
    blob[len(blob) - 100] ^= 1  # inside the second record: image block 2
    path.write_bytes(bytes(blob))
    _chain, problems = bio.verify_chain(str(tmp_path), None)
    assert [p.index for p in problems if p.where == "image"] == [2]
    assert any("file data.rbdiff sha256" in p.message for p in problems)


def test_scan_ignores_partial_and_tampered_backups(tmp_path):
    m = write_backup(str(tmp_path), diff_stream([], size=BLOCK_SIZE), BLOCK_SIZE)
    os.makedirs(tmp_path / ".partial-20261130T000001Z-00000b")
    assert [x.id for x in bio.scan(str(tmp_path))[0]] == [m.id]
    with open(tmp_path / m.id / MANIFEST_FILE, "a") as f:
        f.write(" ")
    complete, partial, bad = bio.scan(str(tmp_path))
    assert complete == [] and partial == [".partial-20261130T000001Z-00000b"]
    assert "does not match" in bad[0]
