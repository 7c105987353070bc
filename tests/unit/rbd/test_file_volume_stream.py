"""Pure parts of the backups of file-backed volumes: the stream encoder, the per-block decisions (what a full or
incremental backup stores), the driver in the manifest, and the destination registry.

The property test builds a backup stream for a random parent/current pair of images with the very functions the
backup uses (``base_blocks``, ``block_record``, the encoders) and checks, with the reference model of
``diffgen.apply``, that the stream applied to the parent gives the current image, that it stores only the blocks
that changed, and that replaying it onto the parent's block checksums gives the current image's checksums.
"""

from __future__ import annotations

import io

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    BLOCK_SIZE,
    FileEntry,
    Manifest,
    ManifestError,
    base_blocks,
    block_record,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination import (
    UnknownDestination,
    open_destination,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination_local import LocalDirectory
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import (
    END_RECORD,
    DiffReader,
    digest_fn,
    encode_header,
    encode_write,
    encode_zero,
    is_zero,
    zero_digest,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .diffgen import apply

KIND = "crc32c"
DIGEST = digest_fn(KIND)
PATTERNS = [bytes(BLOCK_SIZE), b"a" * BLOCK_SIZE, b"b" * BLOCK_SIZE, bytes(BLOCK_SIZE - 1) + b"c"]


def manifest(size: int, blocks: list, bid: str = "20261203T000000Z-00000a") -> Manifest:
    return Manifest(id=bid, seq=1, created_at="2026-12-03T00:00:00Z", type="full", pool="", image="v",
                    image_id="inode:1:2", image_size=size, snapshot="zjusct-backup-t-" + bid, parent=None,
                    from_snapshot=None, chain=[bid], files=[FileEntry("data.rbdiff", 1, "00000000")],
                    blocks=blocks, checksum=KIND, driver="file", volume="v")


def checksums(image: bytes) -> list:
    out = []
    for off in range(0, len(image), BLOCK_SIZE):
        block = image[off:off + BLOCK_SIZE]
        out.append(zero_digest(len(block), KIND) if is_zero(block) else DIGEST(block))
    return out


def stream(parent: Manifest | None, image: bytes) -> tuple[bytes, list, int]:
    """The backup stream of ``image`` on top of ``parent``, made as file_backup._stream makes it."""
    base = base_blocks(parent, len(image), KIND)
    out = bytearray(encode_header(parent.snapshot if parent else None, "to", len(image)))
    records, stored = [], 0
    for i, checksum in enumerate(checksums(image)):
        block = image[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
        rec = block_record(checksum, is_zero(block), base[i])
        if rec == "w":
            out += encode_write(i * BLOCK_SIZE, len(block)) + block
            records.append(("w", i * BLOCK_SIZE, block))
            stored += len(block)
        elif rec == "z":
            out += encode_zero(i * BLOCK_SIZE, len(block))
            records.append(("z", i * BLOCK_SIZE, len(block)))
    out += END_RECORD
    return bytes(out), records, stored


def test_the_encoders_write_what_the_reader_parses():
    size = 2 * BLOCK_SIZE + 5
    raw = (encode_header("from", "to", size) + encode_write(BLOCK_SIZE, 3) + b"xyz" + encode_zero(0, 10)
           + END_RECORD)
    seen = []

    class Sink:
        def resize(self, n):
            seen.append(("s", n))

        def write(self, off, data):
            seen.append(("w", off, bytes(data)))

        def zero(self, off, n):
            seen.append(("z", off, n))

    reader = DiffReader(io.BytesIO(raw).read, lambda n: Sink())
    reader.run()
    assert (reader.from_snap, reader.to_snap, reader.end_size) == ("from", "to", size)
    assert seen == [("s", size), ("w", BLOCK_SIZE, b"xyz"), ("z", 0, 10)]


def test_a_full_backup_starts_from_zero_blocks_and_stores_only_non_zero_ones():
    size = 3 * BLOCK_SIZE - 7
    base = base_blocks(None, size, KIND)
    assert base == [zero_digest(BLOCK_SIZE, KIND)] * 2 + [zero_digest(BLOCK_SIZE - 7, KIND)]
    assert block_record(zero_digest(BLOCK_SIZE, KIND), True, base[0]) is None  # a zero block: nothing stored
    assert block_record("deadbeef", False, base[1]) == "w"


def test_an_incremental_base_is_the_parents_blocks_a_grown_tail_reads_as_zero_a_resized_block_is_unknown():
    parent = manifest(BLOCK_SIZE + 100, ["11111111", "22222222"])
    assert base_blocks(parent, BLOCK_SIZE + 100, KIND) == ["11111111", "22222222"]
    grown = base_blocks(parent, 3 * BLOCK_SIZE, KIND)
    # block 1 was 100 bytes long and is now 4 MiB: unknown, so it is always stored; block 2 is new (zero)
    assert grown == ["11111111", None, zero_digest(BLOCK_SIZE, KIND)]
    assert block_record("11111111", False, "11111111") is None
    assert block_record(zero_digest(BLOCK_SIZE, KIND), True, None) == "z"  # unknown before: say it is zero now
    assert block_record(zero_digest(BLOCK_SIZE, KIND), True, "11111111") == "z"
    assert block_record("33333333", False, "11111111") == "w"


@settings(max_examples=30)  # each example moves several 4 MiB blocks
@given(parent=st.lists(st.sampled_from(range(len(PATTERNS))), min_size=1, max_size=3),
       current=st.lists(st.sampled_from(range(len(PATTERNS))), min_size=1, max_size=3),
       tail=st.sampled_from([0, 1, 4096]))
def test_an_incremental_stream_applied_to_its_parent_gives_the_volume_and_stores_only_changed_blocks(
        parent, current, tail):
    old = b"".join(PATTERNS[p] for p in parent)
    new = b"".join(PATTERNS[p] for p in current) + b"t" * tail
    if len(new) < len(old):  # plan_backup makes a shrunk volume's backup full: not an incremental case
        new += bytes(len(old) - len(new))
    _full, full_records, _stored = stream(None, old)
    assert apply(bytearray(), full_records, len(old)) == old
    pm = manifest(len(old), checksums(old))
    diff, records, stored = stream(pm, new)
    assert apply(bytearray(old), records, len(new)) == new
    changed = sum(1 for r in records if r[0] == "w")
    assert stored == sum(len(r[2]) for r in records if r[0] == "w")
    old_sums, new_sums = checksums(old), checksums(new)
    must = {i for i, s in enumerate(new_sums)
            if (i >= len(old_sums) or s != old_sums[i]) and not is_zero(new[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])}
    assert changed <= len(must) + 1  # + the parent's short last block, rewritten when its length changed
    # replaying the stream onto the parent's checksums gives the new volume's checksums (what verify does)
    _reader, state, _digest = bio.consume_diff(io.BytesIO(diff), len(old), list(old_sums), checksum=KIND)
    got, unknown = state.finish()
    assert unknown == [] and got == new_sums


def test_the_manifest_records_the_source_driver_and_rbd_manifests_keep_their_shape():
    m = manifest(BLOCK_SIZE, [zero_digest(BLOCK_SIZE, KIND)])
    d = m.to_dict()
    assert d["volume"] == {"driver": "file", "name": "v"} and d["kind"] == "RbdBackup"
    again = Manifest.from_dict(d)
    assert (again.driver, again.volume) == ("file", "v")
    rbd = Manifest.from_dict({k: v for k, v in d.items() if k != "volume"})
    assert (rbd.driver, rbd.volume) == ("rbd", None) and "volume" not in rbd.to_dict()
    with pytest.raises(ManifestError, match=r"manifest volume.driver: 'nfs', expected one of file, rbd, qcow2"):
        Manifest.from_dict(dict(d, volume={"driver": "nfs"}))


def test_a_destination_is_a_path_or_a_file_url_and_other_kinds_are_named(tmp_path):
    plain = open_destination(str(tmp_path / "bk"))
    assert isinstance(plain, LocalDirectory) and plain.path == str(tmp_path / "bk")
    url = open_destination(f"file://{tmp_path}/bk")
    assert isinstance(url, LocalDirectory) and url.tag_source() == plain.tag_source()
    assert open_destination(plain) is plain
    with pytest.raises(UnknownDestination, match=r"^dest: 's3://bucket/x' is a destination of kind s3, which is "
                                                   r"not one of: local \(a directory path\)$"):
        open_destination("s3://bucket/x")
    with pytest.raises(UnknownDestination, match=r"^dest: required"):
        open_destination("")
