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
import errno as _errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    BLOCK_SIZE,
    COMPLETE_FILE,
    DATA_FILE,
    MANIFEST_FILE,
    SNAP_PREFIX,
    FileEntry,
    Manifest,
    ManifestError,
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
PARTIAL_PREFIX = ".partial-"
_IO = 4 * 1024 * 1024


class BackupError(CloudError):
    """A backup or restore was refused or failed; ``problems`` lists verification failures (may be empty).

    The module's failure result carries ``problems``: their messages (an empty list when there are none).
    """

    def __init__(self, message: str, problems: Optional[List[Problem]] = None) -> None:
        super().__init__(message, problems=[p.message for p in problems or []])
        self.problems = problems or []


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


# -- destination layout -------------------------------------------------------------------------------------

def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def read_manifest(backup_dir: str) -> Manifest:
    """Read ``manifest.json`` of a complete backup directory; the ``complete`` marker must hold the manifest's
    sha256. Raises ManifestError (naming the directory) otherwise."""
    marker = os.path.join(backup_dir, COMPLETE_FILE)
    try:
        with open(os.path.join(backup_dir, MANIFEST_FILE), "rb") as f:
            raw = f.read()
        with open(marker, encoding="ascii") as f:
            mark = f.read().strip()
    except OSError as exc:
        raise ManifestError(f"{backup_dir}: not a complete backup ({exc.strerror}: {exc.filename})") from None
    if mark != hashlib.sha256(raw).hexdigest():
        raise ManifestError(f"{backup_dir}: {COMPLETE_FILE} does not match {MANIFEST_FILE} (manifest altered?)")
    try:
        return Manifest.from_dict(json.loads(raw))
    except ValueError as exc:
        raise ManifestError(f"{backup_dir}: {exc}") from None


def scan(dest: str) -> Tuple[List[Manifest], List[str], List[str]]:
    """List a destination: (complete manifests, partial directory names, problems with other directories)."""
    complete: List[Manifest] = []
    partial: List[str] = []
    bad: List[str] = []
    if not os.path.isdir(dest):
        return complete, partial, bad
    for name in sorted(os.listdir(dest)):
        path = os.path.join(dest, name)
        if name.startswith(PARTIAL_PREFIX):
            partial.append(name)
        elif name.startswith(".") or not os.path.isdir(path):
            continue
        else:
            try:
                m = read_manifest(path)
            except ManifestError as exc:
                bad.append(str(exc))
                continue
            if m.id != name:
                bad.append(f"{path}: manifest id {m.id} does not match the directory name")
                continue
            complete.append(m)
    return complete, partial, bad


class DestLock:
    """Exclusive ``flock`` on ``<dest>/.lock`` so two backups/retentions never touch one destination at once."""

    def __init__(self, dest: str) -> None:
        self.path = os.path.join(dest, ".lock")
        self.fd: Optional[int] = None

    def __enter__(self) -> "DestLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (_errno.EWOULDBLOCK, _errno.EAGAIN):
                raise BackupError(f"dest: {os.path.dirname(self.path)} is locked by another backup or restore "
                                  "in progress") from None
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


class _SyncingWriter:
    """Writes to a raw file and ``fdatasync``s every 64 MiB, so flushing to disk overlaps with the stream instead
    of piling up for the final fsync (called on the TeeReader worker thread)."""

    EVERY = 64 * 1024 * 1024

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.pending = 0

    def write(self, data: bytes) -> int:
        mv = memoryview(data)
        while mv:
            n = self.f.write(mv) or 0
            mv = mv[n:]
        self.pending += len(data)
        if self.pending >= self.EVERY:
            os.fdatasync(self.f.fileno())
            self.pending = 0
        return len(data)


def _new_id(now: datetime.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def verify_file(dest: str, m: Manifest, base: Optional[List[Optional[str]]], base_size: Optional[int]
                ) -> Tuple[List[Problem], List[Optional[str]]]:
    """Verify one stored backup: file size, checksum and chunk checksums against the manifest, and the image
    blocks its stream determines (applied on ``base``, of the manifest's checksum kind) against the manifest's
    blocks. Returns (problems, computed block checksums)."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import DiffFormatError

    problems: List[Problem] = []
    computed: List[Optional[str]] = [None] * len(m.blocks)
    for entry in m.files:
        path = os.path.join(dest, m.id, entry.name)
        try:
            with open(path, "rb", buffering=_IO) as f:
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


def backup(rbd: Rbd, ref: ImageRef, dest: str, *, vm: Optional[str] = None, owner: Optional[str] = None,
           keep: Optional[int] = None, full_every: int = 7, force_full: bool = False, allow_watchers: bool = False,
           watcher_grace_seconds: float = 35, check_mode: bool = False, now: Optional[datetime.datetime] = None,
           verify: bool = True, on_progress: Optional[Callable[[str], None]] = None,
           checksum: Optional[str] = None) -> Dict[str, Any]:
    """Take one offline backup of ``ref`` into ``dest`` and apply retention.

    ``verify`` re-reads the stored file and checks its checksum before the backup is marked complete.
    ``checksum`` (sha256|crc32c) is the kind a *full* backup records (default ``default_checksum()``: crc32c
    when google-crc32c's C extension is importable); a diff always continues its parent's kind, so a chain
    begun before crc32c stays sha256 until its next full backup. Raises ValueError for an unusable kind.
    Refuses (BackupError) when the image is missing, has watchers (it is in use: stop the VM; ``allow_watchers``
    overrides for crash-consistent copies), or its owner mark differs from ``owner``. Watchers are re-checked
    for up to ``watcher_grace_seconds``: the watch of a client that died without closing the image lingers
    until the OSDs expire it (``osd_client_watch_timeout``, 30 s by default); a live client is refused.
    Returns a dict with ``backup`` (the manifest as JSON), ``plan``, ``retention``, ``removed_snapshots``,
    ``removed_partials``, ``bytes_written``, ``seconds``.
    """
    import time

    t0 = time.monotonic()
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
    if not check_mode:
        os.makedirs(dest, mode=0o700, exist_ok=True)
    tag = dest_tag(dest)
    complete, partial, bad = scan(dest)
    plan = plan_backup(complete, info["id"], int(info["size"]), snaps, full_every=full_every, force_full=force_full)
    result: Dict[str, Any] = {"plan": {"type": plan.type, "parent": plan.parent, "reason": plan.reason},
                              "ignored": bad, "dest_tag": tag}
    if check_mode:
        result["changed"] = True
        return result
    with DestLock(dest):
        for name in partial:  # leftovers of interrupted runs (we hold the lock: nobody is writing them)
            _rmtree(os.path.join(dest, name))
        result["removed_partials"] = partial
        bid = _new_id(now)
        snap = snapshot_name(bid, tag)
        work = os.path.join(dest, PARTIAL_PREFIX + bid)
        os.mkdir(work, 0o700)
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
                with open(os.path.join(work, DATA_FILE), "wb", buffering=0) as out:
                    base: Optional[List[Optional[str]]] = list(parent.blocks) if parent else None
                    reader, state, (size, sha, chunks) = consume_diff(
                        proc.stdout, parent.image_size if parent else None, base, _SyncingWriter(out), checksum=kind)
                    t_sync = time.monotonic()
                    # the final fsync (disk wait) overlaps with the manifest and the verification (CPU) below;
                    # it is joined before anything is called complete
                    syncing = _Background(os.fsync, os.dup(out.fileno()), close_fd=True)
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
                         owner=owner, data_bytes=reader.data_bytes, checksum=kind)
            raw = json.dumps(m.to_dict(), indent=1, sort_keys=True).encode()
            _write_atomic(os.path.join(work, MANIFEST_FILE), raw)
            # verify what is on disk before calling it complete
            t_verify = time.monotonic()
            problems = _verify_stored_file(work, m.files[0], kind) if verify else []
            phases["verify"] = round(time.monotonic() - t_verify, 3)
            syncing.join()
            phases["fsync"] = syncing.seconds
            if problems:
                raise BackupError("backup verification failed: " + "; ".join(p.message for p in problems), problems)
            _write_atomic(os.path.join(work, COMPLETE_FILE), hashlib.sha256(raw).hexdigest().encode() + b"\n")
            os.rename(work, os.path.join(dest, bid))
            _fsync_dir(dest)
        except BaseException:
            _rmtree(work)
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
            result["retention"] = apply_retention(dest, complete, keep)
    result["changed"] = True
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


class _Background:
    """Run ``fn(fd)`` on a thread now; ``join()`` waits and re-raises its error. ``seconds``: how long it took.
    With ``close_fd`` the descriptor is closed when ``fn`` returns (also on error)."""

    def __init__(self, fn: Callable[[int], Any], fd: int, close_fd: bool = False) -> None:
        import threading

        self.error: Optional[BaseException] = None
        self.seconds = 0.0

        def run() -> None:
            import time

            t = time.monotonic()
            try:
                fn(fd)
            except BaseException as exc:
                self.error = exc
            finally:
                if close_fd:
                    os.close(fd)
                self.seconds = round(time.monotonic() - t, 3)

        self._thread = threading.Thread(target=run, name="backup-fsync", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            err, self.error = self.error, None
            raise err


def _verify_stored_file(work: str, entry: FileEntry, kind: str) -> List[Problem]:
    h = ChunkHasher(entry.chunk_size, kind)
    with open(os.path.join(work, entry.name), "rb", buffering=0) as f:
        while True:  # unbuffered reads straight into a new bytes object (google-crc32c takes bytes only)
            data = f.read(_IO)
            if not data:
                break
            h.update(data)
    size, sha, chunks = h.finish()
    return compare_file(os.path.basename(work), entry, size, sha, chunks, kind)


def apply_retention(dest: str, complete: List[Manifest], keep: int) -> Dict[str, Any]:
    """Delete the backups ``plan_retention`` does not keep (renamed to a partial name first, so a crash
    mid-delete never leaves a complete-looking, half-deleted backup). Caller holds the DestLock."""
    plan = plan_retention(complete, keep)
    for bid in plan.delete:
        path = os.path.join(dest, bid)
        doomed = os.path.join(dest, PARTIAL_PREFIX + "deleted-" + bid)
        os.rename(path, doomed)
        _rmtree(doomed)
    return {"keep": plan.keep, "deleted": plan.delete, "kept_for_chain": plan.kept_for_chain}


# -- verify and restore -----------------------------------------------------------------------------------------

def verify_chain(dest: str, backup_id: Optional[str]) -> Tuple[List[Manifest], List[Problem]]:
    """Verify every backup in the chain of ``backup_id`` (None = newest). Returns (chain, problems)."""
    complete, _partial, _bad = scan(dest)
    try:
        chain = resolve_chain(complete, backup_id)
    except ValueError as exc:
        raise BackupError(str(exc)) from None
    _check_kinds(chain)
    problems: List[Problem] = []
    base: Optional[List[Optional[str]]] = None
    base_size: Optional[int] = None
    for m in chain:
        found, _computed = verify_file(dest, m, base, base_size)
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


def restore(rbd: Rbd, dest: str, target: ImageRef, backup_id: Optional[str] = None, *,
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
    """
    import time

    t0 = time.monotonic()
    existing = rbd.info(target.at(None))
    if existing is not None:
        meta = rbd.meta(target.at(None))
        done = meta.get(META_RESTORED_FROM)
        if done and (backup_id is None or done == backup_id):
            return {"changed": False, "backup_id": done, "image": target.spec, "verified_blocks": 0,
                    "msg": f"{target.spec} already restored from backup {done}"}
        raise BackupError(f"target: {target.spec} already exists; restore only into a new image")
    if verify_first or check_mode:
        chain, problems = verify_chain(dest, backup_id)
        if problems:
            raise BackupError("restore refused, backup damaged: " + "; ".join(p.message for p in problems),
                              problems)
    else:
        complete, _partial, _bad = scan(dest)
        try:
            chain = resolve_chain(complete, backup_id)
        except ValueError as exc:
            raise BackupError(str(exc)) from None
    _check_kinds(chain)
    last = chain[-1]
    if owner and last.owner and owner != last.owner and not operator:
        raise BackupError(f"owner: {owner!r} is not the owner {last.owner!r} of backup {last.id} (its manifest's "
                          "owner); a backup is restored only for its owner, or by an operator (operator=true)")
    result: Dict[str, Any] = {"backup_id": last.id, "chain": [m.id for m in chain], "image": target.spec,
                              "size_bytes": last.image_size, "owner": owner or last.owner}
    if check_mode:
        result["changed"] = True
        return result
    created = False
    try:
        rbd.create(target.at(None), size_bytes=chain[0].image_size)
        created = True
        t_import = time.monotonic()
        base: Optional[List[Optional[str]]] = None
        base_size: Optional[int] = None
        for m in chain:
            for entry in m.files:
                problems = _import_member(rbd, dest, m, entry, target.at(None), base, base_size)
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
        problems = compare_blocks(last.id, last.blocks, blocks, what=f"restored image {target.spec}",
                                  kind=last.checksum)
        if problems:
            raise BackupError("restore verification failed: " + "; ".join(p.message for p in problems[:5]),
                              problems)
        if not keep_snapshots:
            rbd.snap_purge(target.at(None))
        rbd.meta_set(target.at(None), META_RESTORED_FROM, last.id)
        if owner or last.owner:
            rbd.meta_set(target.at(None), META_OWNER, owner or str(last.owner))
    except BaseException:
        if created:
            _remove_image(rbd, target.at(None))
        raise
    result["changed"] = True
    result["verified_blocks"] = len(blocks)
    result["phases"] = phases
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def _import_member(rbd: Rbd, dest: str, m: Manifest, entry: FileEntry, target: ImageRef,
                   base: Optional[List[Optional[str]]], base_size: Optional[int]) -> List[Problem]:
    """Import one stored file with ``rbd import-diff <file>`` while a thread checksums the same file; return the
    problems found. rbd reads the file itself (no relay of every byte through this process and a pipe); the
    checksum is known only at the end of the file either way, and a mismatch fails the restore, which removes
    the new image — the read-back then compares every block of what was imported with the manifest. On a
    mismatch (or when rbd rejects the stream) the file is replayed onto the block checksums to name the image
    blocks it would corrupt."""
    import threading

    path = os.path.abspath(os.path.join(dest, m.id, entry.name))
    digest: Dict[str, Any] = {}

    def checksum() -> None:
        try:
            h = ChunkHasher(kind=m.checksum)
            with open(path, "rb", buffering=0) as f:
                for piece in iter(lambda: f.read(_IO), b""):
                    h.update(piece)
            digest["size"], digest["sum"], _chunks = h.finish()
        except OSError as exc:
            digest["error"] = exc

    if not os.path.isfile(path):
        return [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} cannot be read: "
                        "no such file")]
    worker = threading.Thread(target=checksum, name="backup-restore-sum", daemon=True)
    worker.start()
    rbd_error: Optional[RbdError] = None
    try:
        rbd.run(["import-diff", path, target.spec, "--no-progress"], json_out=False)
    except RbdError as exc:
        rbd_error = exc
    finally:
        worker.join()
    if "error" in digest:
        return [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} cannot be read: "
                        f"{digest['error'].strerror}")]
    intact = digest["size"] == entry.size and digest["sum"] == entry.digest
    if intact:
        if rbd_error is not None:
            raise rbd_error
        return []
    found, _computed = verify_file(dest, m, base, base_size)
    return found or [Problem(m.id, entry.name, -1, 0, 0, f"backup {m.id}: file {entry.name} does not match "
                             "its manifest")]


def run_backup_module(p: Dict[str, Any], rbd: Rbd, check_mode: bool = False) -> Dict[str, Any]:
    """The ``rbd_backup`` module: dispatch on ``state`` and shape the result (no block lists in results).

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
        out: Dict[str, Any] = {"changed": True, "type": res["plan"]["type"], "reason": res["plan"]["reason"],
                               "parent": res["plan"]["parent"], "ignored": res.get("ignored", []),
                               "dest_tag": res["dest_tag"]}
        m = res.get("backup")
        if m:
            out.update(backup_id=m["id"], chain=m["chain"], snapshot=m["snapshot"], owner=m.get("owner"),
                       image_size_bytes=m["image"]["sizeBytes"], data_bytes=m["dataBytes"],
                       bytes_written=res["bytes_written"], removed_snapshots=res["removed_snapshots"],
                       removed_partials=res["removed_partials"], seconds=res["seconds"], phases=res["phases"])
        if "retention" in res:
            out["retention"] = res["retention"]
        return out
    if state == "verified":
        chain, problems = verify_chain(dest, p.get("backup_id"))
        if problems:
            raise BackupError(f"backup {chain[-1].id} is damaged: " + "; ".join(x.message for x in problems[:5]),
                              problems)
        return {"changed": False, "backup_id": chain[-1].id, "chain": [m.id for m in chain],
                "image_size_bytes": chain[-1].image_size, "files_checked": sum(len(m.files) for m in chain)}
    target = ImageRef(check_name("target_pool", p.get("target_pool") or p["pool"]),
                      check_name("target_name", p["target_name"]))
    res = restore(rbd, dest, target, p.get("backup_id"), owner=p.get("owner"),
                  keep_snapshots=bool(p.get("keep_snapshots")), check_mode=check_mode,
                  operator=bool(p.get("operator")))
    if "size_bytes" in res:
        res["image_size_bytes"] = res.pop("size_bytes")
    return res


__all__ = ["SNAP_PREFIX", "BackupError", "apply_retention", "backup", "restore", "run_backup_module", "scan",
           "verify_chain"]
