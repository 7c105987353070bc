"""The rbd diff v1 parser and per-block checksums, against a bytearray model of the image."""

from __future__ import annotations

import hashlib
import io

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import (
    BLOCK_SIZE,
    BlockState,
    DiffFormatError,
    DiffReader,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .diffgen import apply, diff_stream

MiB = 1024 * 1024


def model_blocks(img: bytes) -> list[str]:
    return [hashlib.sha256(img[i:i + BLOCK_SIZE]).hexdigest() for i in range(0, len(img), BLOCK_SIZE)]


def run(stream: bytes, start_size=None, base=None, piece=BLOCK_SIZE):
    src = io.BytesIO(stream)

    def factory(size):
        return BlockState(start_size if base is not None else size, base)

    reader = DiffReader(src.read, factory, start_size=start_size if base is not None else None, piece=piece)
    state = reader.run()
    return reader, state.finish()


def test_full_stream_checksums_equal_those_of_the_image_it_describes():
    size = 5 * BLOCK_SIZE + 12345
    recs = [("w", 100, b"a" * 5000), ("w", 2 * BLOCK_SIZE - 10, b"b" * 20), ("z", 3 * BLOCK_SIZE, 10),
            ("w", size - 7, b"tail!!!")]
    reader, (blocks, unknown) = run(diff_stream(recs, size=size))
    assert unknown == []
    assert blocks == model_blocks(apply(bytearray(), recs, size))
    assert reader.end_size == size and reader.to_snap == "s" and reader.data_bytes == 5000 + 20 + 7


def test_diff_on_a_base_rewriting_whole_blocks_is_fully_known():
    size = 4 * BLOCK_SIZE
    base_img = bytearray(b"x" * size)
    recs = [("w", BLOCK_SIZE, b"y" * BLOCK_SIZE), ("z", 3 * BLOCK_SIZE, BLOCK_SIZE)]
    _, (blocks, unknown) = run(diff_stream(recs, from_snap="a", size=size), start_size=size,
                               base=model_blocks(base_img))
    assert unknown == []
    assert blocks == model_blocks(apply(base_img, recs, size))


def test_partial_rewrite_on_a_base_is_reported_unknown_not_guessed():
    size = 2 * BLOCK_SIZE
    base = model_blocks(b"x" * size)
    _, (blocks, unknown) = run(diff_stream([("w", 10, b"q")], from_snap="a", size=size), start_size=size, base=base)
    assert unknown == [0]
    assert blocks[0] is None and blocks[1] == base[1]


def test_growing_image_reads_zero_in_new_blocks_and_shrinking_drops_blocks():
    size = 2 * BLOCK_SIZE
    base_img = bytearray(b"x" * size)
    _, (grown, unknown) = run(diff_stream([], from_snap="a", size=4 * BLOCK_SIZE), start_size=size,
                              base=model_blocks(base_img))
    assert unknown == [] and grown == model_blocks(apply(base_img, [], 4 * BLOCK_SIZE))
    _, (shrunk, unknown) = run(diff_stream([], from_snap="a", size=BLOCK_SIZE), start_size=size,
                               base=model_blocks(base_img))
    assert unknown == [] and shrunk == model_blocks(base_img[:BLOCK_SIZE])


def test_stream_going_back_to_a_finished_block_marks_it_unknown():
    size = 3 * BLOCK_SIZE
    base = model_blocks(bytes(size))
    recs = [("w", 0, b"a" * BLOCK_SIZE), ("w", 2 * BLOCK_SIZE, b"c" * BLOCK_SIZE), ("w", 0, b"z")]
    _, (_blocks, unknown) = run(diff_stream(recs, from_snap="a", size=size), start_size=size, base=base)
    assert 0 in unknown


@pytest.mark.parametrize(("stream", "needle"), [
    (b"not a diff at all", "not an rbd diff v1"),
    (b"rbd diff v2\n", "v2"),
    (diff_stream([("w", 0, b"abc")], size=BLOCK_SIZE)[:-3], "truncated"),
    (diff_stream([], size=BLOCK_SIZE)[:-1], "without the end record"),
    (diff_stream([], size=BLOCK_SIZE)[:-1] + b"X", "unknown record tag"),
    (diff_stream([("w", BLOCK_SIZE, b"a")], size=BLOCK_SIZE), "beyond the image size"),
])
def test_malformed_streams_are_refused_with_the_position(stream, needle):
    with pytest.raises(DiffFormatError, match=needle):
        run(stream)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_property_full_and_aligned_diff_checksums_match_the_model(data):
    nblocks = data.draw(st.integers(1, 4))
    size = nblocks * BLOCK_SIZE - data.draw(st.sampled_from([0, 1, 4096]))
    size = max(size, 1)
    # full export: arbitrary extents in ascending order
    offsets = sorted(set(data.draw(st.lists(st.integers(0, size - 1), max_size=6))))
    recs = []
    for off in offsets:
        ln = data.draw(st.integers(1, min(9000, size - off)))
        if data.draw(st.booleans()):
            recs.append(("w", off, bytes([data.draw(st.integers(1, 255))]) * ln))
        else:
            recs.append(("z", off, ln))
    piece = data.draw(st.sampled_from([BLOCK_SIZE, 4096, 777]))
    _, (blocks, unknown) = run(diff_stream(recs, size=size), piece=piece)
    img = apply(bytearray(), recs, size)
    assert unknown == [] and blocks == model_blocks(img)
    # then a whole-object diff on top of it, possibly resizing
    new_size = data.draw(st.sampled_from([size, nblocks * BLOCK_SIZE, (nblocks + 1) * BLOCK_SIZE]))
    touched = sorted(set(data.draw(st.lists(st.integers(0, (new_size - 1) // BLOCK_SIZE), max_size=3))))
    recs2 = []
    for b in touched:
        ln = min(BLOCK_SIZE, new_size - b * BLOCK_SIZE)
        recs2.append(("w", b * BLOCK_SIZE, bytes([b + 7]) * ln) if data.draw(st.booleans())
                     else ("z", b * BLOCK_SIZE, ln))
    _, (blocks2, unknown2) = run(diff_stream(recs2, from_snap="s", size=new_size), start_size=size, base=blocks)
    want = model_blocks(apply(img, recs2, new_size))
    for i, b in enumerate(blocks2):
        assert b is None or b == want[i]
        assert (b is None) == (i in unknown2)
    # unknown only where a short last block changed length and was not rewritten
    assert all(i in ((size - 1) // BLOCK_SIZE, (new_size - 1) // BLOCK_SIZE) for i in unknown2)
