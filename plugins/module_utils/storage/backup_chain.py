# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Offline volume backups: the manifest model, chain planning, retention and verification. Pure functions only.

A *backup* is one point-in-time copy of one volume, stored as one ``rbd diff v1`` file whatever the volume's
driver: either *full* (the whole volume, diffed from nothing) or *diff* (the changes since the previous backup).
For an RBD image the stream is ``rbd export-diff`` of a snapshot (a diff needs the previous backup's snapshot to
still exist on the image); for a file-backed volume (``file``: raw, ``qcow2``) it is written by the backup itself,
one ``w`` record per stored 4 MiB block (:func:`block_record` decides which: a diff stores only the blocks whose
checksum differs from the previous backup's), and the snapshot names of the chain only link the streams. Restoring
backup B applies its *chain* — the full backup it descends from, then every diff up to B — to a new volume of any
driver (``rbd import-diff``, or writing the records into a sparse file). Each backup lives in ``<dest>/<id>/``
with ``data.rbdiff``, ``manifest.json`` and, written last, ``complete``; a directory without ``complete`` is not a
backup (docs/backup-restore.md "What a backup is"; the destination kinds: :mod:`storage.destination`).

The manifest records, besides identity (VM, owner, pool/image/id, snapshot, parent), the size and checksum of each
file (optionally one per 4 MiB chunk of it), and one checksum per 4 MiB block of the image as it reads at the
snapshot. The checksum kind is the manifest's ``checksum``: ``crc32c`` for backups made since crc32c was
introduced (when the host has google-crc32c), ``sha256`` when the key is absent (every older backup). The file
checksums catch damage to the stored bytes; the block checksums prove a restored image equals the source, block
by block.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import DRIVER_NAMES
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import (
    CHECKSUMS,
    HEX_LEN,
    block_count,
    zero_digest,
)

API_VERSION = "backup.cloud.zjusct.io/v1"
KIND = "RbdBackup"
BLOCK_SIZE = 4 * 1024 * 1024
DATA_FILE = "data.rbdiff"
MANIFEST_FILE = "manifest.json"
COMPLETE_FILE = "complete"
SNAP_PREFIX = "zjusct-backup-"
TAG_LEN = 8
_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")
_HEX = {kind: re.compile(r"^[0-9a-f]{%d}$" % n) for kind, n in HEX_LEN.items()}


class ManifestError(CloudError, ValueError):
    """A manifest is malformed; the message names the field."""


@dataclass
class FileEntry:
    """One stored file. ``size`` in bytes; ``digest``: checksum of the whole file, hex, of the manifest's kind
    (sha256: ``sha256sum``-compatible; crc32c: 8 hex digits); ``chunks``: optional checksum of each
    ``chunk_size`` piece (empty when not recorded — backups rely on the image block checksums to locate damage,
    which saves a hashing pass)."""

    name: str
    size: int
    digest: str
    chunks: List[str] = field(default_factory=list)
    chunk_size: int = 0
    format: str = "rbd-diff-v1"


@dataclass
class Manifest:
    """What one backup holds. Sizes in bytes; ``blocks``: checksum (kind ``checksum``: sha256 or crc32c) of each
    4 MiB block of the image at ``snapshot`` (the last block may be short)."""

    id: str
    seq: int
    created_at: str
    type: str  # "full" | "diff"
    pool: str
    image: str
    image_id: str
    image_size: int
    snapshot: str
    parent: Optional[str]
    from_snapshot: Optional[str]
    chain: List[str]
    files: List[FileEntry]
    blocks: List[str]
    vm: Optional[str] = None
    owner: Optional[str] = None
    block_size: int = BLOCK_SIZE
    data_bytes: int = 0
    checksum: str = "sha256"
    driver: str = "rbd"
    volume: Optional[str] = None
    api_version: str = API_VERSION
    kind: str = KIND

    def to_dict(self) -> Dict[str, Any]:
        """The JSON shape written to ``manifest.json`` (camelCase keys). A sha256 manifest has exactly the shape
        written before crc32c existed (no ``checksum`` key, ``files[].sha256``); a crc32c one adds
        ``checksum: crc32c`` and names the file checksum ``files[].crc32c``."""
        d = asdict(self)
        kind = d["checksum"]
        out = {
            "apiVersion": d["api_version"], "kind": d["kind"], "id": d["id"], "seq": d["seq"],
            "createdAt": d["created_at"], "type": d["type"], "vm": d["vm"], "owner": d["owner"],
            "image": {"pool": d["pool"], "name": d["image"], "id": d["image_id"], "sizeBytes": d["image_size"]},
            "snapshot": d["snapshot"], "parent": d["parent"], "fromSnapshot": d["from_snapshot"],
            "chain": d["chain"], "dataBytes": d["data_bytes"],
            "files": [{"name": f["name"], "format": f["format"], "sizeBytes": f["size"], kind: f["digest"],
                       "chunkSize": f["chunk_size"], "chunks": f["chunks"]} for f in d["files"]],
            "blockSize": d["block_size"], "blocks": d["blocks"],
        }
        if kind != "sha256":
            out["checksum"] = kind
        if d["driver"] != "rbd" or d["volume"]:  # RBD backups keep the shape written before other drivers
            out["volume"] = {"driver": d["driver"], "name": d["volume"]}
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Manifest":
        """Parse and validate the JSON shape; raise ManifestError naming the first bad field."""
        def need(obj: Dict[str, Any], key: str, typ: Any, where: str) -> Any:
            if key not in obj:
                raise ManifestError(f"manifest {where}{key}: missing")
            val = obj[key]
            if not isinstance(val, typ) or (isinstance(val, bool) and typ is int):
                raise ManifestError(f"manifest {where}{key}: {val!r} is not {getattr(typ, '__name__', typ)}")
            return val

        if not isinstance(d, dict):
            raise ManifestError("manifest: not a JSON object")
        if d.get("apiVersion") != API_VERSION or d.get("kind") != KIND:
            raise ManifestError(f"manifest apiVersion/kind: {d.get('apiVersion')!r}/{d.get('kind')!r}, "
                                f"expected {API_VERSION}/{KIND}")
        img = need(d, "image", dict, "")
        kind = d.get("checksum", "sha256")
        if kind not in CHECKSUMS:
            raise ManifestError(f"manifest checksum: {kind!r}, expected one of {', '.join(CHECKSUMS)}")
        files = []
        for i, f in enumerate(need(d, "files", list, "")):
            where = f"files[{i}]."
            chunks = need(f, "chunks", list, where)
            files.append(FileEntry(name=need(f, "name", str, where), size=need(f, "sizeBytes", int, where),
                                   digest=need(f, kind, str, where), chunks=chunks,
                                   chunk_size=need(f, "chunkSize", int, where), format=need(f, "format", str, where)))
        vol = d.get("volume") or {}
        if not isinstance(vol, dict):
            raise ManifestError(f"manifest volume: {vol!r} is not dict")
        m = cls(id=need(d, "id", str, ""), seq=need(d, "seq", int, ""), created_at=need(d, "createdAt", str, ""),
                type=need(d, "type", str, ""), pool=need(img, "pool", str, "image."),
                image=need(img, "name", str, "image."), image_id=need(img, "id", str, "image."),
                image_size=need(img, "sizeBytes", int, "image."), snapshot=need(d, "snapshot", str, ""),
                parent=d.get("parent"), from_snapshot=d.get("fromSnapshot"), chain=need(d, "chain", list, ""),
                files=files, blocks=need(d, "blocks", list, ""), vm=d.get("vm"), owner=d.get("owner"),
                block_size=need(d, "blockSize", int, ""), data_bytes=int(d.get("dataBytes", 0)), checksum=kind,
                driver=vol.get("driver") or "rbd", volume=vol.get("name"))
        validate(m)
        return m


def validate(m: Manifest) -> None:
    """Check internal consistency of a manifest; raise ManifestError naming the field."""
    if not _ID_RE.match(m.id):
        raise ManifestError(f"manifest id: {m.id!r} is not YYYYmmddTHHMMSSZ-xxxxxx")
    if m.type not in ("full", "diff"):
        raise ManifestError(f"manifest type: {m.type!r}, expected full or diff")
    if (m.type == "full") != (m.parent is None):
        raise ManifestError(f"manifest parent: {m.parent!r} does not match type {m.type!r}")
    if not m.chain or m.chain[-1] != m.id or (m.type == "full") != (len(m.chain) == 1):
        raise ManifestError(f"manifest chain: {m.chain!r} must end with the id {m.id!r} and start at a full")
    if m.block_size != BLOCK_SIZE:
        raise ManifestError(f"manifest blockSize: {m.block_size} is not {BLOCK_SIZE}")
    nblocks = (m.image_size + BLOCK_SIZE - 1) // BLOCK_SIZE
    if len(m.blocks) != nblocks:
        raise ManifestError(f"manifest blocks: {len(m.blocks)} checksums for {m.image_size} bytes, "
                            f"expected {nblocks}")
    if m.checksum not in CHECKSUMS:
        raise ManifestError(f"manifest checksum: {m.checksum!r}, expected one of {', '.join(CHECKSUMS)}")
    if m.driver not in DRIVER_NAMES:
        raise ManifestError(f"manifest volume.driver: {m.driver!r}, expected one of {', '.join(DRIVER_NAMES)}")
    hexre = _HEX[m.checksum]
    for i, b in enumerate(m.blocks):
        if not isinstance(b, str) or not hexre.match(b):
            raise ManifestError(f"manifest blocks[{i}]: {b!r} is not a {m.checksum} hex digest")
    for f in m.files:
        if "/" in f.name or f.name.startswith("."):
            raise ManifestError(f"manifest files: name {f.name!r} must be a plain file name")
        if f.chunks and len(f.chunks) != max(1, (f.size + f.chunk_size - 1) // max(1, f.chunk_size)):
            raise ManifestError(f"manifest files[{f.name}].chunks: {len(f.chunks)} for {f.size} bytes")


# -- chain planning ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BackupPlan:
    """What the next backup does: ``type`` full|diff, its parent (diff only), the snapshot to diff from,
    the chain it will belong to, its sequence number and a human reason."""

    type: str
    parent: Optional[str]
    from_snapshot: Optional[str]
    chain: List[str]
    seq: int
    reason: str


def dest_tag(dest: str) -> str:
    """The destination's tag in the names of the snapshots it creates: the first 8 hex digits of the sha256 of
    the destination's absolute path with symlinks resolved (``os.path.realpath``), UTF-8 encoded — the same as
    ``printf %s "$(realpath DEST)" | sha256sum | cut -c1-8``. Stable for one directory however it is spelled."""
    return hashlib.sha256(os.path.realpath(dest).encode("utf-8", "surrogateescape")).hexdigest()[:TAG_LEN]


def snapshot_name(backup_id: str, tag: Optional[str] = None) -> str:
    """The source-image snapshot a backup is taken from: ``zjusct-backup-<tag>-<backup id>`` (``tag`` from
    ``dest_tag``); without a tag the name used before destinations tagged their snapshots,
    ``zjusct-backup-<backup id>``."""
    name = f"{SNAP_PREFIX}{tag}-{backup_id}" if tag else SNAP_PREFIX + backup_id
    return _names.fit(name, _names.RBD_NAME_MAX)  # ids are 23 characters: never cut in practice


def latest(backups: Iterable[Manifest]) -> Optional[Manifest]:
    """The complete backup with the highest seq, or None."""
    best = None
    for m in backups:
        if best is None or m.seq > best.seq:
            best = m
    return best


def plan_backup(backups: Sequence[Manifest], image_id: str, image_size: int, source_snapshots: Iterable[str],
                full_every: int = 7, force_full: bool = False) -> BackupPlan:
    """Decide full or diff for the next backup of an image.

    A diff is taken when the newest complete backup is of the same image (same RBD image id, so a recreated
    image with the same name never gets a diff against foreign data), its snapshot still exists on the image,
    its chain is shorter than ``full_every`` backups, and ``force_full`` is false. Otherwise full; the reason
    says why.

    Args:
        backups: complete backups in the destination (any order; other images' backups are ignored).
        image_id: the RBD image id (``rbd info`` field ``id``).
        image_size: current image size in bytes (a shrink since the last backup forces a full backup).
        source_snapshots: snapshot names existing on the image now.
        full_every: maximum chain length (1 = always full); must be >= 1.
    Raises:
        ValueError: full_every < 1.
    """
    if full_every < 1:
        raise ValueError(f"full_every: {full_every} is below the minimum 1")
    mine = [m for m in backups if m.image_id == image_id]
    seq = max([m.seq for m in backups], default=0) + 1
    last = latest(mine)
    snaps = set(source_snapshots)

    def full(reason: str) -> BackupPlan:
        return BackupPlan("full", None, None, [], seq, reason)

    if force_full:
        return full("force_full requested")
    if last is None:
        return full("no earlier complete backup of this image in the destination")
    if last.snapshot not in snaps:
        return full(f"snapshot {last.snapshot} of backup {last.id} no longer exists on the image (removed "
                    "outside this destination's backups): a full backup starts a new chain")
    if len(last.chain) >= full_every:
        return full(f"chain of backup {last.id} has {len(last.chain)} backups (full_every={full_every})")
    if image_size < last.image_size:
        return full(f"image shrank from {last.image_size} to {image_size} bytes since backup {last.id}")
    return BackupPlan("diff", last.id, last.snapshot, list(last.chain), seq,
                      f"diff since backup {last.id} (snapshot {last.snapshot})")


def base_blocks(parent: Optional[Manifest], size: int, kind: str) -> List[Optional[str]]:
    """What each 4 MiB block of a volume of ``size`` bytes reads as before a backup's stream is applied: the
    checksums (kind ``kind``) the stream starts from.

    A full backup starts from nothing: every block reads as zero. A diff starts from ``parent``'s blocks; a block
    beyond the parent's size reads as zero (the stream's ``s`` record grows the volume with zeros); a block whose
    length changed (the parent's short last block, now longer) is None: unknown, so :func:`block_record` always
    stores it. ``size`` is never below the parent's (:func:`plan_backup` makes a shrunk volume's backup full).
    """
    out: List[Optional[str]] = []
    for i in range(block_count(size)):
        length = min(BLOCK_SIZE, size - i * BLOCK_SIZE)
        if parent is None or i * BLOCK_SIZE >= parent.image_size:
            out.append(zero_digest(length, kind))
        elif min(BLOCK_SIZE, parent.image_size - i * BLOCK_SIZE) == length:
            out.append(parent.blocks[i])
        else:
            out.append(None)
    return out


def block_record(checksum: str, zero: bool, base: Optional[str]) -> Optional[str]:
    """The record a file-backed volume's backup stores for one block: ``"w"`` (its data), ``"z"`` (it reads as zero
    now and did not before), or None (unchanged since ``base``, nothing stored).

    Args:
        checksum: the block's checksum now.
        zero: the block reads as zero now.
        base: its checksum before the stream (:func:`base_blocks`; None = unknown).
    """
    if base is not None and checksum == base:
        return None
    return "z" if zero else "w"


@dataclass(frozen=True)
class RetentionPlan:
    """Backups to keep and to delete (ids, newest first), and why extra ones are kept."""

    keep: List[str]
    delete: List[str]
    kept_for_chain: List[str] = field(default_factory=list)


def plan_retention(backups: Sequence[Manifest], keep: int) -> RetentionPlan:
    """Keep the ``keep`` newest complete backups and every backup their chains need; delete the rest.

    A kept diff needs every earlier member of its chain (back to its full), so those are kept even when
    older than the newest ``keep`` — retention never breaks a restorable chain.

    Raises:
        ValueError: keep < 1 (the newest backup is always kept).
    """
    if keep < 1:
        raise ValueError(f"keep: {keep} is below the minimum 1")
    ordered = sorted(backups, key=lambda m: m.seq, reverse=True)
    newest = ordered[:keep]
    needed = {m.id for m in newest}
    extra = []
    for m in newest:
        for anc in m.chain:
            if anc not in needed:
                needed.add(anc)
                extra.append(anc)
    return RetentionPlan(keep=[m.id for m in ordered if m.id in needed],
                         delete=[m.id for m in ordered if m.id not in needed],
                         kept_for_chain=sorted(set(extra), reverse=True))


def stale_snapshots(source_snapshots: Iterable[str], latest_backup: Optional[Manifest], tag: str,
                    owned: Iterable[str] = ()) -> List[str]:
    """This destination's backup snapshots on the source image that are no longer needed: those it owns except
    the newest backup's (the base of the next diff).

    A destination owns the snapshots named with its ``tag`` (``zjusct-backup-<tag>-*``, see ``dest_tag``:
    also those of its interrupted backups) and the ``owned`` names — the snapshots its own manifests and
    partial backups record, which covers snapshots named before tags existed (``zjusct-backup-<id>``) and a
    destination whose path (hence tag) changed. Snapshots of other destinations and snapshots not made by
    backups are never listed.
    """
    keep = latest_backup.snapshot if latest_backup else None
    mine = SNAP_PREFIX + tag + "-"
    owned = set(owned)
    return sorted(s for s in source_snapshots if (s.startswith(mine) or s in owned) and s != keep)


def resolve_chain(backups: Sequence[Manifest], backup_id: Optional[str]) -> List[Manifest]:
    """The manifests to import, full first, to restore ``backup_id`` (None = the newest complete backup).

    Raises:
        ValueError: no backups, unknown id, or a chain member is missing or inconsistent (named).
    """
    by_id = {m.id: m for m in backups}
    if backup_id is None:
        target = latest(backups)
        if target is None:
            raise ValueError("backup_id: no complete backup in the destination")
    elif backup_id not in by_id:
        raise ValueError(f"backup_id: {backup_id!r} is not a complete backup in the destination "
                         f"(have: {', '.join(sorted(by_id)) or 'none'})")
    else:
        target = by_id[backup_id]
    chain: List[Manifest] = []
    for i, cid in enumerate(target.chain):
        m = by_id.get(cid)
        if m is None:
            raise ValueError(f"backup {target.id}: chain member {cid} is missing or incomplete")
        if i == 0 and m.type != "full":
            raise ValueError(f"backup {target.id}: chain starts at {cid}, which is not a full backup")
        if i > 0 and (m.parent != target.chain[i - 1] or m.from_snapshot != chain[-1].snapshot):
            raise ValueError(f"backup {cid}: parent {m.parent} does not follow {target.chain[i - 1]} in the chain")
        if i > 0 and m.checksum != chain[0].checksum:  # a diff continues its full's checksum kind
            raise ValueError(f"backup {cid}: checksum {m.checksum} differs from {chain[0].checksum} of the "
                             f"chain's full backup {chain[0].id}")
        chain.append(m)
    return chain


# -- verification -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """One verification failure. ``where`` is a file name or ``image``; ``index`` the chunk/block index
    (or -1 for the whole file); ``start``/``end`` the byte range; ``message`` a full sentence."""

    backup: str
    where: str
    index: int
    start: int
    end: int
    message: str


class BackupError(CloudError):
    """A backup or restore was refused or failed; ``problems`` lists verification failures (may be empty).

    The module's failure result carries ``problems``: their messages (an empty list when there are none).
    """

    def __init__(self, message: str, problems: Optional[List[Problem]] = None, **details: Any) -> None:
        super().__init__(message, problems=[p.message for p in problems or []], **details)
        self.problems = problems or []


def compare_file(backup: str, entry: FileEntry, size: int, digest: str, chunks: Sequence[str],
                 kind: str = "sha256") -> List[Problem]:
    """Compare a file as measured (size, checksum and chunk checksums of kind ``kind``) with its manifest entry;
    name each damaged chunk with its byte range."""
    problems: List[Problem] = []
    if size != entry.size:
        problems.append(Problem(backup, entry.name, -1, 0, size,
                                f"backup {backup}: file {entry.name} has {size} bytes, manifest says {entry.size}"))
    for i, (want, got) in enumerate(zip(entry.chunks, chunks, strict=False)):
        if want != got:
            start, end = i * entry.chunk_size, min((i + 1) * entry.chunk_size, entry.size) - 1
            problems.append(Problem(backup, entry.name, i, start, end,
                                    f"backup {backup}: file {entry.name} chunk {i} (bytes {start}-{end}) "
                                    f"is damaged: {kind} {got[:12]}... != manifest {want[:12]}..."))
    if not problems and digest != entry.digest:
        problems.append(Problem(backup, entry.name, -1, 0, size,
                                f"backup {backup}: file {entry.name} {kind} {digest[:12]}... != manifest "
                                f"{entry.digest[:12]}..."))
    return problems


def compare_blocks(backup: str, want: Sequence[str], got: Sequence[Optional[str]], what: str = "image",
                   kind: str = "sha256") -> List[Problem]:
    """Compare image block checksums (``got`` may hold None = not checked here); name each differing block
    with its byte range and MiB offset."""
    problems: List[Problem] = []
    if len(want) != len(got):
        problems.append(Problem(backup, what, -1, 0, 0, f"backup {backup}: {what} has {len(got)} blocks, "
                                f"manifest has {len(want)}"))
        return problems
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if g is not None and w != g:
            start = i * BLOCK_SIZE
            problems.append(Problem(backup, what, i, start, start + BLOCK_SIZE - 1,
                                    f"backup {backup}: {what} block {i} (offset {start // (1024 * 1024)} MiB, "
                                    f"bytes {start}-{start + BLOCK_SIZE - 1}) does not match the manifest: "
                                    f"{kind} {g[:12]}... != {w[:12]}..."))
    return problems
