# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Effects of offline backups of file-backed volumes (``file``: raw, ``qcow2``) and of restores into them.

The backups are the same as those of RBD images (:mod:`storage.backup_io`): one ``rbd diff v1`` stream per backup,
the same manifest (``volume.driver`` names the source's driver), the same chain, checksums, destinations and
retention; so any backup restores into any driver — ``rbd import-diff`` reads a file volume's stream, and an RBD
image's stream restores into a file here.

Backup (:func:`backup_volume`): with QEMU's writers held off the file (:func:`storage.volume_blocks.hold_off_writers`),
the guest-visible blocks are read once (:mod:`storage.volume_blocks`; holes and zero ranges are not read) and
each block's checksum is computed; a full backup stores every non-zero block (``w``), a diff only the blocks
whose checksum differs from the previous backup's (``w``, or ``z`` for a block that now reads as zero;
:func:`storage.backup_chain.block_record`). The diff's base is the previous backup's *manifest*, not a snapshot
of the volume, so nothing is kept on the volume between backups and a diff is right whatever happened to the
file since (it compares what the blocks hold now). The stream's records are written to the destination by a
second thread while the next block is read; the stored file is then re-read and checked before ``complete``.

Restore (:func:`restore_volume`): the chain's streams are applied, full first, to a new sparse file under a
temporary name (``<target>.restoring-<random>``, flocked while in use) while each stream's checksum is computed;
the result (for qcow2 converted with ``qemu-img convert``) is read back and every 4 MiB block compared with the
manifest, fsynced, then linked to the target name (never replacing a file there). Killed at any point, the target
name does not exist; the next restore to it removes the leftovers of dead runs.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import io
import os
import queue
import secrets
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Set

from ansible_collections.zjusct.cloud.plugins.module_utils.storage import qcow2_bitmap
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    DATA_FILE,
    BackupError,
    FileEntry,
    Manifest,
    base_blocks,
    block_record,
    compare_blocks,
    dest_tag,
    plan_backup,
    snapshot_name,
    stale_snapshots,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import (
    RESTORING,
    ChunkHasher,
    Dest,
    TeeReader,
    apply_retention,
    check_restore_owner,
    load_chain,
    publish,
    verify_file,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination import open_destination
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import (
    END_RECORD,
    DiffFormatError,
    DiffReader,
    check_checksum,
    default_checksum,
    digest_fn,
    encode_header,
    encode_write,
    encode_zero,
    is_zero,
    zero_digest,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import file_writers
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume_blocks import (
    FORMATS,
    QEMU_IMG_TIMEOUT,
    RawTarget,
    VolumeBusy,
    VolumeReadError,
    hold_off_writers,
    open_source,
)

_IO = 4 * 1024 * 1024


def volume_id(path: str) -> str:
    """The identity of a file volume that a diff's base must share (``image.id`` in the manifest): the file
    system's device and inode numbers. A volume deleted and made again gets a new inode (usually), so its next
    backup is full; a diff is correct either way, since it compares block contents."""
    st = os.stat(path)
    return f"inode:{st.st_dev}:{st.st_ino}"


class _WriteBehind:
    """Checksums and writes pieces to a staged file on a worker thread (os.write releases the GIL, so it overlaps
    with reading and checksumming the next block). ``close()`` waits and re-raises the worker's error."""

    def __init__(self, sink: Any, hasher: ChunkHasher, depth: int = 4) -> None:
        self.sink, self.hasher = sink, hasher
        self.size = 0
        self._q: "queue.Queue[Optional[List[bytes]]]" = queue.Queue(depth)
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._work, name="backup-write", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            pieces = self._q.get()
            if pieces is None:
                return
            if self._error is not None:
                continue
            try:
                for piece in pieces:
                    self.hasher.update(piece)
                    self.sink.write(piece)
            except BaseException as exc:
                self._error = exc

    def put(self, *pieces: bytes) -> None:
        if self._error is not None:
            self.close()
        self.size += sum(len(p) for p in pieces)
        self._q.put(list(pieces))

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err


def _new_id(now: datetime.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def backup_volume(path: str, fmt: str, dest: Dest, *, driver: str = "file", volume: Optional[str] = None,
                  vm: Optional[str] = None, owner: Optional[str] = None, keep: Optional[int] = None,
                  full_every: int = 7, force_full: bool = False, check_mode: bool = False,
                  now: Optional[datetime.datetime] = None, verify: bool = True,
                  checksum: Optional[str] = None, track_changes: bool = True) -> Dict[str, Any]:
    """Take one offline backup of the file-backed volume ``path`` (format ``fmt``: raw or qcow2) into ``dest``
    and apply retention (module docstring).

    Args:
        driver: the volume driver recorded in the manifest (``file`` or ``qcow2``).
        volume: the host store volume name recorded in the manifest (and used in messages), if any.
        vm, owner: recorded in the manifest.
        keep, full_every, force_full, verify, checksum: as :func:`storage.backup_io.backup`.
        track_changes: qcow2 only - keep a persistent dirty bitmap named after the backup
            (:mod:`storage.qcow2_bitmap`), so that the next incremental backup reads only the blocks QEMU marks
            as written; without it (or when the bitmap is unusable) every block is read and compared.

    Returns:
        The shape of :func:`storage.backup_io.backup`'s result: ``plan``, ``backup`` (the manifest as JSON),
        ``bytes_written``, ``removed_partials``, ``removed_snapshots`` (the dirty bitmaps removed from a qcow2
        volume), ``retention``, ``phases`` (``read`` — reading, checksumming and writing the stream —,
        ``verify``, ``fsync``), ``read_blocks`` (blocks read of the volume's), ``seconds``, ``dest_tag``,
        ``ignored``.

    Raises:
        BackupError: the file is missing or in use (a process has it open, or QEMU's write lock is held: the VM
            runs), the destination is locked by another run, or the stored file does not verify; nothing
            complete-looking is left behind.
        ValueError: an unusable ``checksum`` or ``full_every``.
    """
    t0 = time.monotonic()
    what = volume or path
    if fmt not in FORMATS:
        raise BackupError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if not os.path.isfile(path):
        raise BackupError(f"volume {what}: {path} does not exist")
    destination = open_destination(dest)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    busy = file_writers(path)
    if busy:
        raise BackupError(f"volume {what}: {path} is in use by {', '.join(busy)}; stop the VM before an offline "
                          "backup")
    tag = dest_tag(destination.tag_source())
    job = _Job(path, fmt, destination, tag, driver=driver, volume=volume, vm=vm, owner=owner, full_every=full_every,
               force_full=force_full, verify=verify, checksum=checksum, track=track_changes and fmt == "qcow2")
    try:
        if check_mode:
            with hold_off_writers(path):
                plan = job.plan(destination.scan()[0])
            return {"plan": {"type": plan.type, "parent": plan.parent, "reason": _reason(plan, None, None)},
                    "ignored": destination.scan()[2], "dest_tag": tag, "changed": True}
        destination.prepare()
        with destination.lock():
            result = job.run(now)
            if keep:
                result["retention"] = apply_retention(destination, job.complete, keep)
    except (VolumeBusy, VolumeReadError) as exc:
        raise BackupError(f"volume {what}: {exc}") from None
    result["changed"] = True
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


class _Job:
    """One backup of a file-backed volume, run under the destination's lock (:func:`backup_volume`)."""

    def __init__(self, path: str, fmt: str, destination: Any, tag: str, **opts: Any) -> None:
        self.path, self.fmt, self.destination, self.tag = path, fmt, destination, tag
        self.o = opts
        self.complete: List[Manifest] = []
        self.identity = ""
        self.size = 0

    def plan(self, complete: List[Manifest], src: Any = None) -> Any:
        """Full or diff (:func:`storage.backup_chain.plan_backup`); the caller holds writers off."""
        self.identity = volume_id(self.path)
        if src is None:
            src = open_source(self.path, self.fmt)
            src.close()
        self.size = src.size
        # a file's diff base is the previous backup's manifest: it "exists" as long as that backup does
        return plan_backup(complete, self.identity, self.size, [m.snapshot for m in complete],
                           full_every=self.o["full_every"], force_full=self.o["force_full"])

    def run(self, now: datetime.datetime) -> Dict[str, Any]:
        complete, partial, bad = self.destination.scan()
        for name in partial:  # leftovers of interrupted runs (we hold the lock: nobody is writing them)
            self.destination.remove_partial(name)
        bid = _new_id(now)
        snap = snapshot_name(bid, self.tag)
        note: Optional[str] = None
        tracked = False
        if self.o["track"]:  # before the read: from now on QEMU records every write in it
            try:
                qcow2_bitmap.add(self.path, snap)
                tracked = True
            except qcow2_bitmap.BitmapError as exc:
                if exc.in_use:
                    raise BackupError(f"volume {self.o['volume'] or self.path}: {self.path} is open for writing "
                                      f"(a VM runs): {exc}") from None
                note = f"no dirty bitmap kept ({exc})"
        staging = None
        try:
            with hold_off_writers(self.path), contextlib.closing(open_source(self.path, self.fmt)) as src:
                plan = self.plan(complete, src)
                parent = next((m for m in complete if m.id == plan.parent), None)
                dirty: Optional[Set[int]] = None
                if parent is not None and self.fmt == "qcow2":
                    dirty = qcow2_bitmap.dirty_blocks(self.path, parent.snapshot, self.size, _IO)
                    if dirty is None:
                        note = note or (f"dirty bitmap {parent.snapshot} missing or unusable (a VM killed while "
                                        "running leaves it in use): every block compared")
                kind = parent.checksum if parent else (self.o["checksum"] or default_checksum())
                check_checksum(kind)
                staging = self.destination.stage(bid)
                m, size, phases, read = self._write(src, staging, plan, parent, kind, bid, snap, now, dirty)
        except BaseException:
            if staging is not None:
                staging.abort()
            if tracked:  # (after the writers' lock is released: qemu-img opens the image read-write)
                qcow2_bitmap.remove(self.path, [snap])
            raise
        complete.append(m)
        self.complete = complete
        removed: List[str] = []
        if self.fmt == "qcow2":  # this destination's bitmaps other than the new diff base (never another's)
            names = list((qcow2_bitmap.read_bitmaps(self.path) or {}))
            stale = stale_snapshots(names, m, self.tag, [x.snapshot for x in complete])
            removed = qcow2_bitmap.remove(self.path, stale)
        return {"plan": {"type": plan.type, "parent": plan.parent, "reason": _reason(plan, dirty, note)},
                "ignored": bad, "dest_tag": self.tag, "removed_snapshots": removed, "removed_partials": partial,
                "backup": m.to_dict(), "bytes_written": size, "phases": phases, "read_blocks": read}

    def _write(self, src: Any, staging: Any, plan: Any, parent: Optional[Manifest], kind: str, bid: str,
               snap: str, now: datetime.datetime, dirty: Optional[Set[int]]) -> Any:
        t_read = time.monotonic()
        out = staging.create(DATA_FILE)
        hasher = ChunkHasher(kind=kind)
        writer = _WriteBehind(out, hasher)
        try:
            blocks, data_bytes, read = _stream(src, parent, kind, plan.from_snapshot, snap, writer, dirty)
        finally:
            writer.close()
        durable = out.finish()
        phases = {"read": round(time.monotonic() - t_read, 3)}
        size, digest, chunks = hasher.finish()
        m = Manifest(id=bid, seq=plan.seq, created_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), type=plan.type,
                     pool="", image=self.o["volume"] or os.path.basename(self.path), image_id=self.identity,
                     image_size=self.size, snapshot=snap, parent=plan.parent, from_snapshot=plan.from_snapshot,
                     chain=[*plan.chain, bid], files=[FileEntry(DATA_FILE, size, digest, chunks, 0)],
                     blocks=blocks, vm=self.o["vm"], owner=self.o["owner"], data_bytes=data_bytes, checksum=kind,
                     driver=self.o["driver"], volume=self.o["volume"])
        publish(staging, m, durable, self.o["verify"], phases)
        return m, size, phases, read


def _reason(plan: Any, dirty: Optional[Set[int]], note: Optional[str]) -> str:
    """The plan's reason in a file volume's terms (its diff base is the parent's manifest, not a snapshot)."""
    if plan.type == "diff":
        how = (f"the {len(dirty)} blocks its qcow2 dirty bitmap marks, compared" if dirty is not None
               else "the blocks whose checksum differs from its manifest")
        text = f"diff since backup {plan.parent}: {how}"
    else:
        text = plan.reason.replace("of this image", "of this volume")
    return f"{text}; {note}" if note else text


def _stream(src: Any, parent: Optional[Manifest], kind: str, from_snap: Optional[str], to_snap: str,
            writer: _WriteBehind, dirty: Optional[Set[int]] = None) -> Any:
    """Read the blocks of ``src`` once and write the backup's ``rbd diff v1`` stream (module docstring): every block,
    or with ``dirty`` (the blocks written since ``parent``) only those and the blocks whose base is unknown; the
    others keep the parent's checksum and store nothing.
    Returns (the block checksums of the volume, the data bytes stored, the number of blocks read)."""
    digest = digest_fn(kind)
    base = base_blocks(parent, src.size, kind)
    only = None if dirty is None else dirty | {i for i, b in enumerate(base) if b is None}
    blocks: List[str] = []
    data_bytes = 0
    read = 0
    zero_run: Optional[List[int]] = None  # [offset, length] of consecutive "z" blocks, written as one record
    writer.put(encode_header(from_snap, to_snap, src.size))
    for idx, data in src.blocks(only):
        while len(blocks) < idx:  # not written since the parent: unchanged
            blocks.append(str(base[len(blocks)]))
        read += 1
        offset = idx * _IO
        length = min(_IO, src.size - offset)
        zero = data is None or is_zero(data)
        checksum = zero_digest(length, kind) if zero else digest(data)
        blocks.append(checksum)
        record = block_record(checksum, zero, base[idx])
        if record != "z" and zero_run is not None:
            writer.put(encode_zero(*zero_run))
            zero_run = None
        if record == "w":
            writer.put(encode_write(offset, length), data)
            data_bytes += length
        elif record == "z":
            if zero_run is None:
                zero_run = [offset, 0]
            zero_run[1] += length
    if zero_run is not None:
        writer.put(encode_zero(*zero_run))
    writer.put(END_RECORD)
    while len(blocks) < len(base):
        blocks.append(str(base[len(blocks)]))
    if len(blocks) != len(base):
        raise BackupError(f"path: {src.path}: {len(blocks)} blocks read, expected {len(base)} (file changed?)")
    return blocks, data_bytes, read


# -- restore ---------------------------------------------------------------------------------------------------

def _remove_leftovers(target: str) -> List[str]:
    """Remove ``<target>.restoring-*`` files of restores that are no longer running (their flock is free)."""
    directory, base = os.path.split(target)
    removed = []
    for name in sorted(os.listdir(directory or ".")):
        if not name.startswith(base + RESTORING):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live restore holds it
        try:
            os.unlink(path)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def restore_volume(dest: Dest, target: str, fmt: str = "raw", backup_id: Optional[str] = None, *,
                   owner: Optional[str] = None, operator: bool = False, check_mode: bool = False,
                   verify_first: bool = False) -> Dict[str, Any]:
    """Apply the chain of ``backup_id`` (None = newest) to the NEW file ``target`` of format ``fmt`` (raw or qcow2)
    and verify every block (module docstring). Any backup restores, whatever driver it was taken from.

    ``owner``/``operator``: a backup is given only to its owner (:func:`storage.backup_io.check_restore_owner`).

    Returns:
        ``{"changed", "backup_id", "chain", "path", "format", "size_bytes", "owner", "verified_blocks", "phases":
        {"apply", "read_back", "fsync"[, "convert"]}, "seconds", "removed_leftovers"}``.

    Raises:
        BackupError: the target exists, the backup is unknown, damaged (the blocks named) or not this owner's, or
            the restored data does not match the manifest; then no file is left at ``target``.
    """
    t0 = time.monotonic()
    if fmt not in FORMATS:
        raise BackupError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
    destination = open_destination(dest)
    if os.path.lexists(target):
        raise BackupError(f"target: {target} already exists; restore only into a new volume")
    chain = load_chain(destination, backup_id, verify_first or check_mode)
    last = chain[-1]
    check_restore_owner(last, owner, operator)
    result: Dict[str, Any] = {"backup_id": last.id, "chain": [m.id for m in chain], "path": target, "format": fmt,
                              "size_bytes": last.image_size, "owner": owner or last.owner}
    if check_mode:
        result["changed"] = True
        return result
    directory = os.path.dirname(target) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    result["removed_leftovers"] = _remove_leftovers(target)
    tmp = f"{target}{RESTORING}{secrets.token_hex(3)}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    temps = [tmp]
    linked = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the end: tells _remove_leftovers this one is alive
        t_apply = time.monotonic()
        applied = RawTarget(fd, chain[0].image_size)
        base: Optional[List[Optional[str]]] = None
        base_size: Optional[int] = None
        for m in chain:
            _apply_member(destination, m, applied, base, base_size)
            base, base_size = list(m.blocks), m.image_size
        applied.resize(last.image_size)
        phases = {"apply": round(time.monotonic() - t_apply, 3)}
        final = tmp
        if fmt == "qcow2":
            t_convert = time.monotonic()
            final = f"{target}{RESTORING}{secrets.token_hex(3)}.qcow2"
            temps.append(final)
            _convert(tmp, final)
            phases["convert"] = round(time.monotonic() - t_convert, 3)
        t_read = time.monotonic()
        got = _read_blocks(final, fmt, last.checksum)
        phases["read_back"] = round(time.monotonic() - t_read, 3)
        problems = compare_blocks(last.id, last.blocks, got, what=f"restored volume {target}", kind=last.checksum)
        if problems:
            raise BackupError("restore verification failed: " + "; ".join(p.message for p in problems[:5]),
                              problems)
        t_sync = time.monotonic()
        with open(final, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.link(final, target)  # never replaces a file there
        except FileExistsError:
            raise BackupError(f"target: {target} appeared during the restore; restore only into a new "
                              "volume") from None
        linked = True
        _fsync_dir(directory)
        phases["fsync"] = round(time.monotonic() - t_sync, 3)
        result["written_bytes"] = applied.written_bytes
    except BaseException:
        if linked:
            os.unlink(target)
        raise
    finally:
        for path in temps:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        os.close(fd)
    result["changed"] = True
    result["verified_blocks"] = len(got)
    result["phases"] = phases
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def _apply_member(destination: Any, m: Manifest, target: RawTarget, base: Optional[List[Optional[str]]],
                  base_size: Optional[int]) -> None:
    """Apply the stream(s) of one backup to ``target`` while checksumming them; a stream that does not match its
    manifest is replayed onto the block checksums to name the damaged blocks (BackupError)."""
    for entry in m.files:
        problem: Optional[str] = None
        try:
            src = io.BufferedReader(destination.open_file(m.id, entry.name), _IO)
        except FileNotFoundError:
            raise BackupError(f"restore refused, backup damaged: backup {m.id}: file {entry.name} cannot be read: "
                              "no such file") from None
        hasher = ChunkHasher(kind=m.checksum)
        tee = TeeReader(src, hasher)
        try:
            DiffReader(tee.read, lambda size: target, start_size=target.size).run()
        except DiffFormatError as exc:
            problem = str(exc)
        finally:
            try:
                tee.close()
            finally:
                src.close()
        size, digest, _chunks = hasher.finish()
        if problem is None and size == entry.size and digest == entry.digest:
            continue
        found, _computed = verify_file(destination, m, base, base_size)
        messages = [p.message for p in found] or [f"backup {m.id}: file {entry.name} does not match its manifest"
                                                  + (f" ({problem})" if problem else "")]
        raise BackupError("restore refused, backup damaged: " + "; ".join(messages), found)


def _convert(raw: str, qcow2: str) -> None:
    try:
        proc = subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, qcow2],
                              capture_output=True, text=True, timeout=QEMU_IMG_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackupError(f"target: qemu-img convert: {exc}") from exc
    if proc.returncode != 0:
        raise BackupError(f"target: qemu-img convert: {proc.stderr.strip() or proc.stdout.strip()}")
    os.chmod(qcow2, 0o600)


def _read_blocks(path: str, fmt: str, kind: str) -> List[Optional[str]]:
    """Every 4 MiB block's checksum of the volume at ``path`` as the guest reads it."""
    digest = digest_fn(kind)
    src = open_source(path, fmt)
    try:
        out: List[Optional[str]] = []
        for idx, data in src.blocks():
            length = min(_IO, src.size - idx * _IO)
            out.append(zero_digest(length, kind) if data is None or is_zero(data) else digest(data))
        return out
    finally:
        src.close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
