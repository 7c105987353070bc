"""Build ``rbd diff v1`` streams by hand for unit tests (the format as documented in Ceph doc/dev/rbd-diff.rst)."""

from __future__ import annotations

import struct


def diff_stream(records: list[tuple], from_snap: str | None = None, to_snap: str | None = "s",
                size: int | None = None) -> bytes:
    """records: ("w", offset, data) or ("z", offset, length), emitted in the given order."""
    out = bytearray(b"rbd diff v1\n")
    if from_snap:
        out += b"f" + struct.pack("<I", len(from_snap)) + from_snap.encode()
    if to_snap:
        out += b"t" + struct.pack("<I", len(to_snap)) + to_snap.encode()
    if size is not None:
        out += b"s" + struct.pack("<Q", size)
    for rec in records:
        if rec[0] == "w":
            out += b"w" + struct.pack("<QQ", rec[1], len(rec[2])) + rec[2]
        else:
            out += b"z" + struct.pack("<QQ", rec[1], rec[2])
    out += b"e"
    return bytes(out)


def apply(image: bytearray, records: list[tuple], size: int) -> bytearray:
    """Reference model: the image after the records (resized to ``size``)."""
    img = bytearray(image[:size]) + bytearray(max(0, size - len(image)))
    for rec in records:
        if rec[0] == "w":
            img[rec[1]:rec[1] + len(rec[2])] = rec[2]
        else:
            img[rec[1]:rec[1] + rec[2]] = bytes(rec[2])
    return img
