# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Effects of offline RBD backup and restore: snapshot, export-diff streamed through checksums into files,
atomic manifest and ``complete`` marker, verification, retention, import into a new image and read-back check.

Decisions (full or diff, what to retain, which chain to import, what counts as damage) come from
``storage.backup_chain``;
the ``rbd diff v1`` parsing and block checksums from ``storage.rbd_diff``. This file only moves bytes and calls rbd.

Integrity without halving throughput: the export stream is read once; the same bytes are written to the file,
fed to the file checksum, the 4 MiB chunk checksums and the block-state parser. Checksums are crc32c (hardware
CRC through google-crc32c, about 5x cheaper than sha256 here) for new chains, sha256 for chains begun before
(and where the C extension is missing); each manifest names its kind and every path reads both. Full backups
are ``export-diff`` streams from nothing, so unallocated space is neither transferred nor hashed.

Crash safety: a backup is written into ``<dest>/.partial-<id>/``; ``manifest.json`` is written atomically, then
verified, then ``complete`` (holding the manifest's sha256) is written and fsynced, and only then is the
directory renamed to ``<dest>/<id>``. An interrupted backup therefore never has a ``complete`` marker and never
carries a backup id as its directory name; the next run removes it and its snapshot.

Ownership of source snapshots: one image may be backed up into several destinations (say a local disk kept 7
deep and an off-site mount kept 4 deep), each with its own chain and diff base. Each destination names its
snapshots ``zjusct-backup-<tag>-<id>`` with its own ``dest_tag`` and removes only snapshots it owns (its tag, or
named by its own manifests), so one destination's run never deletes another's diff base.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import secrets
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple, Union

from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    BLOCK_SIZE,
    DATA_FILE,
    SNAP_PREFIX,
    BackupError,
    FileEntry,
    Manifest,
    Problem,
    compare_blocks,
    compare_file,
    dest_tag,
    latest,
    plan_backup,
    plan_retention,
    resolve_chain,
    snapshot_name,
    stale_snapshots,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination import (
    PARTIAL_PREFIX,
    BackupDestination,
    BackupStaging,
    open_destination,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination_local import (
    DestLock,
    read_manifest,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination_local import (
    fsync_dir as _fsync_dir,  # noqa: F401  (kept for callers of the earlier name)
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination_local import (
    write_atomic as _write_atomic,  # noqa: F401
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import (
    META_OWNER,
    ImageRef,
    Rbd,
    RbdError,
    RbdNotFound,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import (
    BlockState,
    DiffReader,
    StreamDigest,
    block_count,
    check_checksum,
    default_checksum,
    digest_fn,
)

META_RESTORED_FROM = "cloud.zjusct.io/restored-from"
RESTORING = ".restoring-"
"""Infix of the temporary name a restore writes under before the volume gets its name (RBD image or file)."""
_IO = 4 * 1024 * 1024
Dest = Union[str, BackupDestination]
"""A destination as the functions here take it: what the user typed (``dest``) or a BackupDestination."""


# -- checksummed streams -------------------------------------------------------------------------------------

class ChunkHasher:
    """Checksum (kind ``kind``: sha256 or crc32c) of a whole byte stream plus (if ``chunk_size`` > 0) one per
    ``chunk_size`` piece of it."""

    def __init__(self, chunk_size: int = 0, kind: str = "sha256") -> None:
        self.chunk_size = chunk_size
        self.kind = kind
        self.total = StreamDigest(kind)
        self.chunks: List[str] = []
        self._cur = StreamDigest(kind)
        self._fill = 0
        self.size = 0

    def update(self, data: Any) -> None:
        self.total.update(data)  # as given: crc32c takes bytes only, a memoryview would be copied
        self.size += len(data)
        if not self.chunk_size:
            return
        mv = memoryview(data)
        pos = 0
        while pos < len(mv):
            n = min(len(mv) - pos, self.chunk_size - self._fill)
            self._cur.update(mv[pos:pos + n])
            self._fill += n
            pos += n
            if self._fill == self.chunk_size:
                self.chunks.append(self._cur.hexdigest())
                self._cur = StreamDigest(self.kind)
                self._fill = 0

    def finish(self) -> Tuple[int, str, List[str]]:
        """Return (size in bytes, checksum hex, chunk checksum list). An empty stream has one chunk."""
        if self.chunk_size and (self._fill or not self.chunks):
            self.chunks.append(self._cur.hexdigest())
            self._fill = 0
        return self.size, self.total.hexdigest(), self.chunks


class TeeReader:
    """``read(n)`` from ``src``; every byte read is hashed and (if ``sink``) written to ``sink``.

    Hashing and writing run on a worker thread fed through a bounded queue, so reading the next piece (and
    whatever the caller does with it) overlaps with them: hashlib and file/pipe writes release the GIL (google-crc32c
    does not, but it runs at several GB/s). ``close``
    waits for the worker and re-raises its error (e.g. BrokenPipeError when the consumer died).
    """

    _DEPTH = 4  # pieces in flight (4 x 4 MiB)

    def __init__(self, src: BinaryIO, hasher: ChunkHasher, sink: Optional[Any] = None) -> None:
        import queue
        import threading

        self.src = src
        self.hasher = hasher
        self.sink = sink
        self._pending: List[bytes] = []
        self._pending_len = 0
        self._q: "queue.Queue[Optional[bytes]]" = queue.Queue(self._DEPTH)
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._work, name="backup-tee", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            data = self._q.get()
            if data is None:
                return
            if self._error is not None:
                continue  # drain after a failure
            try:
                self.hasher.update(data)
                if self.sink is not None:
                    self.sink.write(data)
            except BaseException as exc:  # handed to the reading thread in close()/read()
                self._error = exc

    def _put(self, data: bytes) -> None:
        if self._error is not None:
            self.close()
        self._q.put(data)

    def read(self, n: int) -> bytes:
        data = self.src.read(n)
        if data:
            if len(data) >= 65536:
                self._flush()
                self._put(data)
            else:  # small record headers: batch them
                self._pending.append(data)
                self._pending_len += len(data)
                if self._pending_len >= 65536:
                    self._flush()
        return data

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending, self._pending_len = [], 0
            self._put(data)

    def close(self) -> None:
        """Flush, stop the worker, raise its error if any. Idempotent."""
        if self._thread.is_alive():
            if self._error is None:
                self._flush()
            self._q.put(None)
            self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err


# -- destination layout ------------------------------------------------------------------------------------

def scan(dest: Dest) -> Tuple[List[Manifest], List[str], List[str]]:
    """List a destination: (complete manifests, partial entry names, problems with other entries)
    (:meth:`storage.destination.BackupDestination.scan`)."""
    return open_destination(dest).scan()


# -- streaming a diff into checksums ---------------------------------------------------------------------------

def consume_diff(src: BinaryIO, start_size: Optional[int], base: Optional[List[Optional[str]]],
                 sink: Optional[Any] = None, hash_file: bool = True, checksum: str = "sha256"
                 ) -> Tuple[DiffReader, BlockState, Tuple[int, str, List[str]]]:
    """Read an ``rbd diff v1`` stream once: checksum it (file + chunks), optionally copy it to ``sink``, and apply
    it to block checksums starting from ``base`` (None = all-zero image). Every checksum is of kind ``checksum``
    (sha256 or crc32c; ``base``'s too). Returns (reader, state, file digest).
    With ``hash_file`` False (and no sink) only the block checksums are computed and the digest is
    ``(0, "", [])``: the restore's read-back needs the blocks, not the stream's checksum (one pass less).
    Raises DiffFormatError on a malformed stream, ValueError on an unusable ``checksum``."""

    def factory(size: int) -> BlockState:
        if base is None:
            return BlockState(size, None, checksum)
        return BlockState(start_size if start_size is not None else size, base, checksum)

    if not hash_file and sink is None:
        plain = DiffReader(src.read, factory, start_size=start_size if base is not None else None)
        return plain, plain.run(), (0, "", [])
    hasher = ChunkHasher(kind=checksum)
    tee = TeeReader(src, hasher, sink)
    reader = DiffReader(tee.read, factory, start_size=start_size if base is not None else None)
    try:
        state = reader.run()
    finally:
        tee.close()
    return reader, state, hasher.finish()


def copy_hashed(src: BinaryIO, sink: BinaryIO, kind: str = "sha256") -> Tuple[int, str]:
    """Copy ``src`` to ``sink`` (reads on this thread, checksum + write on a worker); return (size, checksum hex
    of kind ``kind``)."""
    hasher = ChunkHasher(kind=kind)
    tee = TeeReader(src, hasher, sink)
    try:
        while tee.read(_IO):
            pass
    finally:
        tee.close()
    size, sha, _chunks = hasher.finish()
    return size, sha


def hash_blocks_from_export(rbd: Rbd, ref: ImageRef, wanted: List[int], timeout: float, kind: str = "sha256"
                            ) -> Dict[int, str]:
    """Checksums (kind ``kind``) of selected 4 MiB blocks, read through ``rbd export <ref> -`` (a full read; used
    only for blocks a diff could not determine)."""
    digest = digest_fn(kind)
    out: Dict[int, str] = {}
    want = set(wanted)
    proc = rbd.popen(["export", ref.spec, "-", "--no-progress"], stdout=-1)
    try:
        idx = 0
        while True:
            data = proc.stdout.read(BLOCK_SIZE)
            if not data:
                break
            if idx in want:
                out[idx] = digest(data)
            idx += 1
    except BaseException:
        proc.kill()
        raise
    proc.finish(timeout=timeout)
    return out


# -- backup ---------------------------------------------------------------------------------------------------

def _parallel(*fns: Callable[[Any], Any], arg: Any) -> List[Any]:
    """Call each ``fn(arg)`` on its own thread; return results in order, re-raising the first error."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(fns)) as pool:
        futures = [pool.submit(fn, arg) for fn in fns]
        return [f.result() for f in futures]


def _new_id(now: datetime.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def verify_file(dest: Dest, m: Manifest, base: Optional[List[Optional[str]]], base_size: Optional[int]
                ) -> Tuple[List[Problem], List[Optional[str]]]:
    """Verify one stored backup: file size, checksum and chunk checksums against the manifest, and the image
    blocks its stream determines (applied on ``base``, of the manifest's checksum kind) against the manifest's
    blocks. Returns (problems, computed block checksums)."""
    import io

    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import DiffFormatError

    destination = open_destination(dest)
    problems: List[Problem] = []
    computed: List[Optional[str]] = [None] * len(m.blocks)
    for entry in m.files:
        try:
            with io.BufferedReader(destination.open_file(m.id, entry.name), _IO) as f:
                try:
                    _unused, state, (size, sha, chunks) = consume_diff(f, base_size, base, checksum=m.checksum)
                    computed, _unknown = state.finish()
                except DiffFormatError as exc:
                    # still name the damaged chunk: hash the raw file
                    f.seek(0)
                    h = ChunkHasher(kind=m.checksum)
                    for piece in iter(lambda: f.read(_IO), b""):
                        h.update(piece)
                    size, sha, chunks = h.finish()
                    problems.append(Problem(m.id, entry.name, -1, 0, size,
                                            f"backup {m.id}: file {entry.name} is not a valid diff stream: {exc}"))
        except OSError as exc:
            problems.append(Problem(m.id, entry.name, -1, 0, 0,
                                    f"backup {m.id}: file {entry.name} cannot be read: {exc.strerror}"))
            continue
        problems = compare_file(m.id, entry, size, sha, chunks, m.checksum) + problems
    # a damaged but parseable stream still yields block checksums: name the image blocks it would corrupt
    problems += compare_blocks(m.id, m.blocks, computed, kind=m.checksum)
    return problems, computed


def backup(rbd: Rbd, ref: ImageRef, dest: Dest, *, vm: Optional[str] = None, owner: Optional[str] = None,
           keep: Optional[int] = None, full_every: int = 7, force_full: bool = False, allow_watchers: bool = False,
           watcher_grace_seconds: float = 35, check_mode: bool = False, now: Optional[datetime.datetime] = None,
           verify: bool = True, checksum: Optional[str] = None, volume: Optional[str] = None) -> Dict[str, Any]:
    """Take one offline backup of ``ref`` into ``dest`` (a path or a :class:`BackupDestination`) and apply
    retention.

    ``verify`` re-reads the stored file and checks its checksum before the backup is marked complete.
    ``checksum`` (sha256|crc32c) is the kind a *full* backup records (default ``default_checksum()``: crc32c
    when google-crc32c's C extension is importable); a diff always continues its parent's kind, so a chain
    begun before crc32c stays sha256 until its next full backup. Raises ValueError for an unusable kind.
    Refuses (BackupError) when the image is missing, has watchers (it is in use: stop the VM; ``allow_watchers``
    overrides for crash-consistent copies), or its owner mark differs from ``owner``. Watchers are re-checked
    for up to ``watcher_grace_seconds``: the watch of a client that died without closing the image lingers
    until the OSDs expire it (``osd_client_watch_timeout``, 30 s by default); a live client is refused.
    ``volume``: the host store volume name recorded in the manifest (``volume.name``), if any.
    Returns a dict with ``backup`` (the manifest as JSON), ``plan``, ``retention``, ``removed_snapshots``,
    ``removed_partials``, ``bytes_written``, ``seconds``.
    """
    import time

    t0 = time.monotonic()
    destination = open_destination(dest)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    head = ref.at(None)
    try:  # four independent queries: run the rbd processes side by side (each pays its own start-up)
        info, watchers, meta, snap_list = _parallel(rbd.info, rbd.status, rbd.meta, rbd.snapshots, arg=head)
    except RbdNotFound:
        info = None
    if info is None:
        raise BackupError(f"image: {ref.pool}/{ref.image} does not exist")
    deadline = time.monotonic() + watcher_grace_seconds
    while watchers and not allow_watchers and time.monotonic() < deadline:
        time.sleep(min(3.0, max(deadline - time.monotonic(), 0)))
        watchers = rbd.status(head)
    if watchers and not allow_watchers:
        names = ", ".join(f"{w.get('address')} (client.{w.get('client')})" for w in watchers)
        raise BackupError(f"image: {ref.pool}/{ref.image} is in use, watchers: {names}; stop the VM (or fence the "
                          "stale client) before an offline backup")
    if owner and meta.get(META_OWNER) and meta[META_OWNER] != owner:
        raise BackupError(f"owner: {owner!r} does not match the image's owner mark {meta[META_OWNER]!r}")
    owner = owner or meta.get(META_OWNER)
    snaps = [s["name"] for s in snap_list]
    tag = dest_tag(destination.tag_source())
    if check_mode:
        complete, _partial, bad = destination.scan()
        plan = plan_backup(complete, info["id"], int(info["size"]), snaps, full_every=full_every,
                           force_full=force_full)
        return {"plan": {"type": plan.type, "parent": plan.parent, "reason": plan.reason}, "ignored": bad,
                "dest_tag": tag, "changed": True}
    destination.prepare()
    with destination.lock():
        complete, partial, bad = destination.scan()
        plan = plan_backup(complete, info["id"], int(info["size"]), snaps, full_every=full_every,
                           force_full=force_full)
        result: Dict[str, Any] = {"plan": {"type": plan.type, "parent": plan.parent, "reason": plan.reason},
                                  "ignored": bad, "dest_tag": tag}
        for name in partial:  # leftovers of interrupted runs (we hold the lock: nobody is writing them)
            destination.remove_partial(name)
        result["removed_partials"] = partial
        bid = _new_id(now)
        snap = snapshot_name(bid, tag)
        staging = destination.stage(bid)
        snap_made = False
        try:
            rbd.snap_create(ref.at(snap))
            snap_made = True
            parent = next((m for m in complete if m.id == plan.parent), None)
            kind = parent.checksum if parent else (checksum or default_checksum())
            check_checksum(kind)
            words = ["export-diff", ref.at(snap).spec, "-", "--whole-object", "--no-progress"]
            if plan.from_snapshot:
                words += ["--from-snap", plan.from_snapshot]
            t_export = time.monotonic()
            proc = rbd.popen(words, stdout=-1)
            try:
                out = staging.create(DATA_FILE)
                base: Optional[List[Optional[str]]] = list(parent.blocks) if parent else None
                reader, state, (size, sha, chunks) = consume_diff(
                    proc.stdout, parent.image_size if parent else None, base, out, checksum=kind)
                t_sync = time.monotonic()
                # the final fsync (disk wait) overlaps with the manifest and the verification (CPU) below;
                # it is joined before anything is called complete
                durable = out.finish()
            except BaseException:
                proc.kill()
                raise
            proc.finish(timeout=rbd.conn.timeout)
            phases = {"export": round(t_sync - t_export, 3)}
            blocks, unknown = state.finish()
            if unknown:
                fixed = hash_blocks_from_export(rbd, ref.at(snap), unknown, rbd.conn.timeout, kind)
                for i in unknown:
                    blocks[i] = fixed[i]
            image_size = reader.end_size if reader.end_size is not None else int(info["size"])
            if len(blocks) != block_count(image_size) or any(b is None for b in blocks):
                raise BackupError(f"internal: block checksums incomplete for {ref.spec}@{snap}")
            m = Manifest(id=bid, seq=plan.seq, created_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), type=plan.type,
                         pool=ref.pool, image=ref.image, image_id=info["id"], image_size=image_size, snapshot=snap,
                         parent=plan.parent, from_snapshot=plan.from_snapshot, chain=[*plan.chain, bid],
                         files=[FileEntry(DATA_FILE, size, sha, chunks, 0)], blocks=[str(b) for b in blocks], vm=vm,
                         owner=owner, data_bytes=reader.data_bytes, checksum=kind, volume=volume)
            publish(staging, m, durable, verify, phases)
        except BaseException:
            staging.abort()
            if snap_made:
                try:
                    rbd.snap_remove(ref.at(snap))
                except RbdError:
                    pass
            raise
        complete.append(m)
        result["backup"] = m.to_dict()
        result["bytes_written"] = size
        result["phases"] = phases
        # this destination's source snapshots no longer needed as a diff base (never another destination's)
        owned = [x.snapshot for x in complete]
        for name in partial:  # interrupted backups, also those named before tags: .partial-<id>
            pid = name[len(PARTIAL_PREFIX):]
            owned += [snapshot_name(pid), snapshot_name(pid, tag)]
        removed_snaps = []
        for s in stale_snapshots([*snaps, snap], latest(x for x in complete if x.image_id == info["id"]), tag,
                                 owned):
            try:
                rbd.snap_remove(ref.at(s))
                removed_snaps.append(s)
            except RbdError:
                pass  # protected or busy: left in place, reported below
        result["removed_snapshots"] = removed_snaps
        if keep:
            result["retention"] = apply_retention(destination, complete, keep)
    result["changed"] = True
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def publish(staging: BackupStaging, m: Manifest, durable: Callable[[], float], verify: bool,
            phases: Dict[str, float]) -> None:
    """Complete a backup whose data file is written: store its manifest, re-read the stored data file against
    the manifest's file checksum (``verify``), wait until the data file is durable (``durable``, from
    :meth:`StagedFile.finish`), then commit (the ``complete`` marker, the sha256 of the manifest, goes last).
    Adds ``verify`` and ``fsync`` seconds to ``phases``.

    Raises:
        BackupError: the stored file does not match (nothing is committed; the caller aborts the staging).
    """
    import time

    raw = json.dumps(m.to_dict(), indent=1, sort_keys=True).encode()
    staging.write_manifest(raw)
    t_verify = time.monotonic()
    problems = _verify_stored_file(staging, m.id, m.files[0], m.checksum) if verify else []
    phases["verify"] = round(time.monotonic() - t_verify, 3)
    phases["fsync"] = durable()
    if problems:
        raise BackupError("backup verification failed: " + "; ".join(p.message for p in problems), problems)
    staging.commit(hashlib.sha256(raw).hexdigest().encode() + b"\n")


def _verify_stored_file(staging: BackupStaging, backup_id: str, entry: FileEntry, kind: str) -> List[Problem]:
    h = ChunkHasher(entry.chunk_size, kind)
    with staging.open(entry.name) as f:
        while True:  # unbuffered reads straight into a new bytes object (google-crc32c takes bytes only)
            data = f.read(_IO)
            if not data:
                break
            h.update(data)
    size, sha, chunks = h.finish()
    return compare_file(PARTIAL_PREFIX + backup_id, entry, size, sha, chunks, kind)


def apply_retention(dest: Dest, complete: List[Manifest], keep: int) -> Dict[str, Any]:
    """Delete the backups ``plan_retention`` does not keep (:meth:`BackupDestination.delete`: hidden first, so a
    crash mid-delete never leaves a complete-looking, half-deleted backup). Caller holds the destination's
    lock."""
    destination = open_destination(dest)
    plan = plan_retention(complete, keep)
    for bid in plan.delete:
        destination.delete(bid)
    return {"keep": plan.keep, "deleted": plan.delete, "kept_for_chain": plan.kept_for_chain}


# -- verify and restore -----------------------------------------------------------------------------------------

def verify_chain(dest: Dest, backup_id: Optional[str]) -> Tuple[List[Manifest], List[Problem]]:
    """Verify every backup in the chain of ``backup_id`` (None = newest). Returns (chain, problems).

    Raises:
        BackupError: no such backup, or its chain is incomplete (named).
    """
    destination = open_destination(dest)
    complete, _partial, _bad = destination.scan()
    try:
        chain = resolve_chain(complete, backup_id)
    except ValueError as exc:
        raise BackupError(str(exc)) from None
    _check_kinds(chain)
    problems: List[Problem] = []
    base: Optional[List[Optional[str]]] = None
    base_size: Optional[int] = None
    for m in chain:
        found, _computed = verify_file(destination, m, base, base_size)
        problems += found
        base, base_size = list(m.blocks), m.image_size
    return chain, problems


def _check_kinds(chain: List[Manifest]) -> None:
    """Raise BackupError (before anything is created) when this host cannot compute a chain's checksum kind."""
    for m in chain:
        try:
            check_checksum(m.checksum)
        except ValueError as exc:
            raise BackupError(f"backup {m.id}: {exc}") from None


def _remove_image(rbd: Rbd, ref: ImageRef) -> None:
    try:
        for s in rbd.snapshots(ref):
            if str(s.get("protected")) == "true":
                rbd.snap_unprotect(ref.at(s["name"]))
        rbd.snap_purge(ref)
        rbd.remove(ref)
    except RbdNotFound:
        pass


def load_chain(dest: Dest, backup_id: Optional[str], verify_first: bool = False) -> List[Manifest]:
    """The chain (full first) to restore ``backup_id`` (None = newest) from ``dest``; with ``verify_first`` every
    file is verified first (:func:`verify_chain`). Refuses (BackupError, before anything is created) an unknown id,
    a broken chain, a damaged file found by the verification, or a checksum kind this host cannot compute."""
    if verify_first:
        chain, problems = verify_chain(dest, backup_id)
        if problems:
            raise BackupError("restore refused, backup damaged: " + "; ".join(p.message for p in problems),
                              problems)
    else:
        complete, _partial, _bad = open_destination(dest).scan()
        try:
            chain = resolve_chain(complete, backup_id)
        except ValueError as exc:
            raise BackupError(str(exc)) from None
    _check_kinds(chain)
    return chain


def check_restore_owner(last: Manifest, owner: Optional[str], operator: bool) -> None:
    """Refuse (BackupError) giving backup ``last`` to an ``owner`` other than its manifest's, unless ``operator``
    (docs/security.md, "Owner authorization")."""
    if owner and last.owner and owner != last.owner and not operator:
        raise BackupError(f"owner: {owner!r} is not the owner {last.owner!r} of backup {last.id} (its manifest's "
                          "owner); a backup is restored only for its owner, or by an operator (operator=true)")


def restore(rbd: Rbd, dest: Dest, target: ImageRef, backup_id: Optional[str] = None, *,
            owner: Optional[str] = None, keep_snapshots: bool = False, check_mode: bool = False,
            verify_first: bool = False, operator: bool = False) -> Dict[str, Any]:
    """Import the chain of ``backup_id`` into the NEW image ``target`` and verify every block.

    The new image gets the owner mark ``owner``, by default the backup's owner. A backup is given only to its
    owner: an ``owner`` that differs from the manifest's is refused before anything is created unless
    ``operator`` is set (docs/security.md, "Owner authorization"), so no caller of the module can take another
    tenant's disk by naming themselves the owner.

    Each file of the chain is read once: the same bytes are checksummed, replayed onto the block checksums and
    streamed into ``rbd import-diff -``; a file whose sha256 or resulting blocks differ from its manifest stops
    the restore naming the damaged block. Then the image is read back (export-diff from nothing) and every
    4 MiB block compared with the manifest. On any failure the new image is removed, so a refused restore
    leaves nothing behind (``verify_first`` checks all files before creating anything, at the cost of a second
    read). An existing target restored from the same backup is reported unchanged; any other is refused.

    The chain is imported into ``<target>.restoring-<random>`` and renamed to ``target`` (``rbd rename``) only when
    every block matched and the marks are written, so a restore killed midway never leaves an image under the
    target's name; the next restore into the same target removes such leftovers that nobody has open (no
    watcher), listed as ``removed_leftovers``.
    """
    import time

    t0 = time.monotonic()
    destination = open_destination(dest)
    existing = rbd.info(target.at(None))
    if existing is not None:
        meta = rbd.meta(target.at(None))
        done = meta.get(META_RESTORED_FROM)
        if done and (backup_id is None or done == backup_id):
            return {"changed": False, "backup_id": done, "image": target.spec, "verified_blocks": 0,
                    "msg": f"{target.spec} already restored from backup {done}"}
        raise BackupError(f"target: {target.spec} already exists; restore only into a new image")
    chain = load_chain(destination, backup_id, verify_first or check_mode)
    last = chain[-1]
    check_restore_owner(last, owner, operator)
    result: Dict[str, Any] = {"backup_id": last.id, "chain": [m.id for m in chain], "image": target.spec,
                              "size_bytes": last.image_size, "owner": owner or last.owner}
    if check_mode:
        result["changed"] = True
        return result
    result["removed_leftovers"] = _remove_restore_leftovers(rbd, target)
    final = target
    target = ImageRef(final.pool, _names.fit(f"{final.image}{RESTORING}{secrets.token_hex(3)}", _names.RBD_NAME_MAX))
    created = False
    try:
        rbd.create(target.at(None), size_bytes=chain[0].image_size)
        created = True
        t_import = time.monotonic()
        base: Optional[List[Optional[str]]] = None
        base_size: Optional[int] = None
        for m in chain:
            for entry in m.files:
                problems = _import_member(rbd, destination, m, entry, target.at(None), base, base_size)
                if problems:
                    raise BackupError("restore refused, backup damaged: " + "; ".join(p.message for p in problems),
                                      problems)
            base, base_size = list(m.blocks), m.image_size
        # read back what the cluster now holds, independently of the files
        t_read = time.monotonic()
        proc = rbd.popen(["export-diff", target.at(last.snapshot).spec, "-", "--whole-object", "--no-progress"],
                         stdout=-1)
        try:
            _reader, state, _digest = consume_diff(proc.stdout, None, None, hash_file=False, checksum=last.checksum)
        except BaseException:
            proc.kill()
            raise
        proc.finish(timeout=rbd.conn.timeout)
        blocks, unknown = state.finish()
        if unknown:
            fixed = hash_blocks_from_export(rbd, target.at(last.snapshot), unknown, rbd.conn.timeout,
                                            last.checksum)
            for i in unknown:
                blocks[i] = fixed.get(i)
        phases = {"import": round(t_read - t_import, 3), "read_back": round(time.monotonic() - t_read, 3)}
        problems = compare_blocks(last.id, last.blocks, blocks, what=f"restored image {final.spec}",
                                  kind=last.checksum)
        if problems:
            raise BackupError("restore verification failed: " + "; ".join(p.message for p in problems[:5]),
                              problems)
        if not keep_snapshots:
            rbd.snap_purge(target.at(None))
        rbd.meta_set(target.at(None), META_RESTORED_FROM, last.id)
        if owner or last.owner:
            rbd.meta_set(target.at(None), META_OWNER, owner or str(last.owner))
        try:  # the image appears under its name only now, complete and verified
            rbd.run(["rename", target.spec, final.spec], json_out=False)
        except RbdError as exc:
            raise BackupError(f"target: {final.spec}: renaming the restored image {target.spec} failed ({exc}); "
                              "restore only into a new image") from None
        created = False
    except BaseException:
        if created:
            _remove_image(rbd, target.at(None))
        raise
    result["changed"] = True
    result["verified_blocks"] = len(blocks)
    result["phases"] = phases
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def _remove_restore_leftovers(rbd: Rbd, target: ImageRef) -> List[str]:
    """Remove ``<target>.restoring-*`` images of restores killed midway: those with no watcher (a live restore's
    ``rbd import-diff`` or read-back has the image open). Returns the names removed."""
    removed = []
    prefix = target.image + RESTORING
    for name in rbd.ls(target.pool):
        if not name.startswith(prefix):
            continue
        ref = ImageRef(target.pool, name)
        try:
            if rbd.status(ref):
                continue
            _remove_image(rbd, ref)
            removed.append(name)
        except RbdError:
            continue
    return removed


def _import_member(rbd: Rbd, destination: BackupDestination, m: Manifest, entry: FileEntry, target: ImageRef,
                   base: Optional[List[Optional[str]]], base_size: Optional[int]) -> List[Problem]:
    """Import one stored file with ``rbd import-diff`` while its checksum is computed; return the problems found.

    From a local directory rbd reads the file itself (``rbd import-diff <file>``: no relay of every byte through
    this process and a pipe) while a thread checksums the same file; from any other destination the file is
    streamed to ``rbd import-diff -`` and checksummed on the way. The checksum is known only at the end of the
    file either way, and a mismatch fails the restore, which removes the new image — the read-back then compares
    every block of what was imported with the manifest. On a mismatch (or when rbd rejects the stream) the file
    is replayed onto the block checksums to name the image blocks it would corrupt."""
    import threading

    path = destination.local_path(m.id, entry.name)
    digest: Dict[str, Any] = {}

    def checksum() -> None:
        try:
            h = ChunkHasher(kind=m.checksum)
            with destination.open_file(m.id, entry.name) as f:
                for piece in iter(lambda: f.read(_IO), b""):
                    h.update(piece)
            digest["size"], digest["sum"], _chunks = h.finish()
        except OSError as exc:
            digest["error"] = exc

    def missing() -> List[Problem]:
        return [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} cannot be read: "
                        "no such file")]

    rbd_error: Optional[RbdError] = None
    if path is not None:
        if not os.path.isfile(path):
            return missing()
        worker = threading.Thread(target=checksum, name="backup-restore-sum", daemon=True)
        worker.start()
        try:
            rbd.run(["import-diff", os.path.abspath(path), target.spec, "--no-progress"], json_out=False)
        except RbdError as exc:
            rbd_error = exc
        finally:
            worker.join()
    else:
        try:
            src = destination.open_file(m.id, entry.name)
        except FileNotFoundError:
            return missing()
        proc = rbd.popen(["import-diff", "-", target.spec, "--no-progress"], stdin=-1)
        try:
            with src:
                digest["size"], digest["sum"] = copy_hashed(src, proc.stdin, m.checksum)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # rbd refused the stream: its error is raised by finish() below
        except OSError as exc:
            proc.kill()
            digest["error"] = exc
        try:
            proc.finish(timeout=rbd.conn.timeout)
        except RbdError as exc:
            rbd_error = exc
    if "error" in digest:
        return [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} cannot be read: "
                        f"{digest['error'].strerror}")]
    intact = digest.get("size") == entry.size and digest.get("sum") == entry.digest
    if intact:
        if rbd_error is not None:
            raise rbd_error
        return []
    found, _computed = verify_file(destination, m, base, base_size)
    return found or [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} does not match "
                             "its manifest")]


def backup_result(res: Dict[str, Any], driver: str = "rbd", volume: Optional[str] = None) -> Dict[str, Any]:
    """The module result of a backup (:func:`backup` or :func:`storage.file_backup.backup_volume`): rbd_backup's
    keys (no block lists), plus ``driver`` and ``volume`` (the host store volume's name, or None)."""
    out: Dict[str, Any] = {"changed": True, "type": res["plan"]["type"], "reason": res["plan"]["reason"],
                           "parent": res["plan"]["parent"], "ignored": res.get("ignored", []),
                           "dest_tag": res["dest_tag"], "driver": driver, "volume": volume}
    m = res.get("backup")
    if m:
        out.update(backup_id=m["id"], chain=m["chain"], snapshot=m["snapshot"], owner=m.get("owner"),
                   image_size_bytes=m["image"]["sizeBytes"], data_bytes=m["dataBytes"],
                   bytes_written=res["bytes_written"], removed_snapshots=res["removed_snapshots"],
                   removed_partials=res["removed_partials"], seconds=res["seconds"], phases=res["phases"])
    if "read_blocks" in res:
        out["read_blocks"] = res["read_blocks"]
    if "retention" in res:
        out["retention"] = res["retention"]
    return out


def verify_result(dest: Dest, backup_id: Optional[str]) -> Dict[str, Any]:
    """The module result of ``state: verified``: the chain checked, or BackupError naming the damage."""
    chain, problems = verify_chain(dest, backup_id)
    if problems:
        raise BackupError(f"backup {chain[-1].id} is damaged: " + "; ".join(x.message for x in problems[:5]),
                          problems)
    return {"changed": False, "backup_id": chain[-1].id, "chain": [m.id for m in chain],
            "image_size_bytes": chain[-1].image_size, "files_checked": sum(len(m.files) for m in chain),
            "driver": chain[-1].driver}


def run_backup_module(p: Dict[str, Any], rbd: Rbd, check_mode: bool = False) -> Dict[str, Any]:
    """rbd_backup's work on one RBD client (no audit, no host store): dispatch on ``state`` and shape the result.
    The module itself runs :func:`rbd_backup_module.run_rbd_backup` (:func:`host.backup.rbd_backup`), the same
    through the audit.

    Raises BackupError (with ``problems``), ValueError (bad parameter, named) or RbdError.
    """
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import check_name

    for key, lo in (("keep", 1), ("full_every", 1)):
        val = p.get(key)
        if val is not None and not lo <= val <= 10000:
            raise ValueError(f"{key}: {val} is outside the range {lo}-10000")
    dest = p["dest"]
    state = p.get("state") or "present"
    if state == "present":
        ref = ImageRef(check_name("pool", p["pool"]), check_name("name", p["name"]))
        res = backup(rbd, ref, dest, vm=p.get("vm"), owner=p.get("owner"), keep=p.get("keep"),
                     full_every=p.get("full_every") or 7, force_full=bool(p.get("force_full")),
                     allow_watchers=bool(p.get("allow_watchers")),
                     watcher_grace_seconds=float(p.get("watcher_grace_seconds", 35)), check_mode=check_mode,
                     verify=p.get("verify", True) is not False)
        out = backup_result(res)
        del out["driver"], out["volume"]
        return out
    if state == "verified":
        out = verify_result(dest, p.get("backup_id"))
        del out["driver"]
        return out
    target = ImageRef(check_name("target_pool", p.get("target_pool") or p["pool"]),
                      check_name("target_name", p["target_name"]))
    res = restore(rbd, dest, target, p.get("backup_id"), owner=p.get("owner"),
                  keep_snapshots=bool(p.get("keep_snapshots")), check_mode=check_mode,
                  operator=bool(p.get("operator")))
    if "size_bytes" in res:
        res["image_size_bytes"] = res.pop("size_bytes")
    return res


__all__ = ["PARTIAL_PREFIX", "SNAP_PREFIX", "BackupError", "DestLock", "apply_retention", "backup", "backup_result",
           "load_chain", "read_manifest", "restore", "run_backup_module", "scan", "verify_chain", "verify_result"]
