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

import datetime
import fcntl
import io
import os
import queue
import secrets
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

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
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import (
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

RESTORING = ".restoring-"
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
                  checksum: Optional[str] = None) -> Dict[str, Any]:
    """Take one offline backup of the file-backed volume ``path`` (format ``fmt``: raw or qcow2) into ``dest``
    and apply retention (module docstring).

    Args:
        driver: the volume driver recorded in the manifest (``file`` or ``qcow2``).
        volume: the host store volume name recorded in the manifest (and used in messages), if any.
        vm, owner: recorded in the manifest.
        keep, full_every, force_full, verify, checksum: as :func:`storage.backup_io.backup`.

    Returns:
        The shape of :func:`storage.backup_io.backup`'s result: ``plan``, ``backup`` (the manifest as JSON),
        ``bytes_written``, ``removed_partials``, ``removed_snapshots`` (always empty), ``retention``, ``phases``
        (``read`` — reading, checksumming and writing the stream —, ``verify``, ``fsync``), ``seconds``,
        ``dest_tag``, ``ignored``.

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
    try:
        with hold_off_writers(path):
            identity = volume_id(path)
            src = open_source(path, fmt)
            try:
                return _backup_locked(src, destination, tag, identity, now, t0, driver=driver, volume=volume, vm=vm,
                                      owner=owner, keep=keep, full_every=full_every, force_full=force_full,
                                      check_mode=check_mode, verify=verify, checksum=checksum)
            finally:
                src.close()
    except (VolumeBusy, VolumeReadError) as exc:
        raise BackupError(f"volume {what}: {exc}") from None


def _backup_locked(src: Any, destination: Any, tag: str, identity: str, now: datetime.datetime, t0: float, *,
                   driver: str, volume: Optional[str], vm: Optional[str], owner: Optional[str], keep: Optional[int],
                   full_every: int, force_full: bool, check_mode: bool, verify: bool,
                   checksum: Optional[str]) -> Dict[str, Any]:
    def planned() -> Any:
        complete, partial, bad = destination.scan()
        # a file's diff base is the previous backup's manifest: it "exists" as long as that backup does
        plan = plan_backup(complete, identity, src.size, [m.snapshot for m in complete], full_every=full_every,
                           force_full=force_full)
        return complete, partial, bad, plan

    if check_mode:
        _c, _p, bad, plan = planned()
        return {"plan": {"type": plan.type, "parent": plan.parent, "reason": plan.reason}, "ignored": bad,
                "dest_tag": tag, "changed": True}
    destination.prepare()
    with destination.lock():
        complete, partial, bad, plan = planned()
        result: Dict[str, Any] = {"plan": {"type": plan.type, "parent": plan.parent, "reason": plan.reason},
                                  "ignored": bad, "dest_tag": tag, "removed_snapshots": []}
        for name in partial:  # leftovers of interrupted runs (we hold the lock: nobody is writing them)
            destination.remove_partial(name)
        result["removed_partials"] = partial
        parent = next((m for m in complete if m.id == plan.parent), None)
        kind = parent.checksum if parent else (checksum or default_checksum())
        check_checksum(kind)
        bid = _new_id(now)
        snap = snapshot_name(bid, tag)
        staging = destination.stage(bid)
        try:
            t_read = time.monotonic()
            out = staging.create(DATA_FILE)
            hasher = ChunkHasher(kind=kind)
            writer = _WriteBehind(out, hasher)
            try:
                blocks, data_bytes = _stream(src, parent, kind, plan.from_snapshot, snap, writer)
            finally:
                writer.close()
            durable = out.finish()
            phases = {"read": round(time.monotonic() - t_read, 3)}
            size, digest, chunks = hasher.finish()
            m = Manifest(id=bid, seq=plan.seq, created_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), type=plan.type,
                         pool="", image=volume or os.path.basename(src.path), image_id=identity,
                         image_size=src.size, snapshot=snap, parent=plan.parent, from_snapshot=plan.from_snapshot,
                         chain=[*plan.chain, bid], files=[FileEntry(DATA_FILE, size, digest, chunks, 0)],
                         blocks=blocks, vm=vm, owner=owner, data_bytes=data_bytes, checksum=kind, driver=driver,
                         volume=volume)
            publish(staging, m, durable, verify, phases)
        except BaseException:
            staging.abort()
            raise
        complete.append(m)
        result["backup"] = m.to_dict()
        result["bytes_written"] = size
        result["phases"] = phases
        if keep:
            result["retention"] = apply_retention(destination, complete, keep)
    result["changed"] = True
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def _stream(src: Any, parent: Optional[Manifest], kind: str, from_snap: Optional[str], to_snap: str,
            writer: _WriteBehind) -> Any:
    """Read every block of ``src`` once and write the backup's ``rbd diff v1`` stream (module docstring).
    Returns (the block checksums of the volume, the data bytes stored)."""
    digest = digest_fn(kind)
    base = base_blocks(parent, src.size, kind)
    blocks: List[str] = []
    data_bytes = 0
    zero_run: Optional[List[int]] = None  # [offset, length] of consecutive "z" blocks, written as one record
    writer.put(encode_header(from_snap, to_snap, src.size))
    for idx, data in src.blocks():
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
    if len(blocks) != len(base):
        raise BackupError(f"path: {src.path}: {len(blocks)} blocks read, expected {len(base)} (file changed?)")
    return blocks, data_bytes


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
