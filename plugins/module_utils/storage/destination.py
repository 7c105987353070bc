# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where backups are kept: the :class:`BackupDestination` protocol and the registry of destination kinds.

A destination holds the backups of one volume (one chain family): ``<id>/`` entries with ``data.rbdiff``,
``manifest.json`` and, written last, ``complete`` (docs/backup-restore.md "What a backup is"); interrupted ones
under ``.partial-<id>``. The backup and restore code (:mod:`storage.backup_io`, :mod:`storage.file_backup`) only
talks to this protocol, so a new kind of destination (an S3 bucket, another host over SSH) is one new file
``storage/destination_<kind>.py`` with a class that satisfies :class:`BackupDestination`, registered in
:data:`DESTINATIONS` under its URL scheme. The kinds registered now:

* ``local`` (:mod:`storage.destination_local`): a directory, a plain path (``/srv/backup/vm-alice``) or a
  ``file://`` URL; a local disk or a mounted off-site target.

Every kind keeps the same promise: a backup is listed as complete only once its ``complete`` marker (the sha256 of
its manifest) is stored after every other file, so a backup killed at any point never looks complete; retention
hides a backup before removing its files.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, ContextManager, List, Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import Manifest

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8; only the annotations use it
    Protocol = object  # type: ignore[assignment]

PARTIAL_PREFIX = ".partial-"
"""Name prefix of an interrupted (or being written, or being deleted) backup: never restorable."""


class UnknownDestination(CloudError, ValueError):
    """A destination whose URL scheme is not registered (the message names the value and the known kinds)."""


class StagedFile(Protocol):
    """A file of a backup being written (:meth:`BackupStaging.create`)."""

    def write(self, data: Any) -> int:
        """Append ``data`` (bytes-like); returns its length. Raises OSError."""

    def finish(self) -> Callable[[], float]:
        """Close the file and start making it durable; the returned function waits until it is (re-raising the
        error if that failed) and returns the seconds it took. Overlaps the disk's flush with what the caller
        does next (the manifest, the verification)."""


class BackupStaging(Protocol):
    """One backup being written (``.partial-<id>``): nothing in it counts until :meth:`commit`."""

    name: str
    """The partial entry's name (``.partial-<id>``), as :meth:`BackupDestination.scan` lists it."""

    def create(self, name: str) -> StagedFile:
        """A new file ``name`` of the backup (a plain file name)."""

    def write_manifest(self, raw: bytes) -> None:
        """Store ``manifest.json`` atomically and durably."""

    def open(self, name: str) -> BinaryIO:
        """Read back a file written here (the verification before commit)."""

    def local_path(self, name: str) -> Optional[str]:
        """The path of a file written here when the destination is a local directory, else None."""

    def commit(self, complete: bytes) -> None:
        """Store the ``complete`` marker (``complete``: its content) last and durably, then publish the backup
        under its id. After this returns, :meth:`BackupDestination.scan` lists it."""

    def abort(self) -> None:
        """Remove everything written for this backup (best effort: a leftover partial is removed by the next
        backup of the destination)."""


class BackupDestination(Protocol):
    """A place that holds one volume's backups. Every method raises OSError (or a CloudError naming ``dest``)
    when the destination cannot be reached or written."""

    kind: str
    """The registry key (``local``)."""

    url: str
    """The destination as the user gave it (results, messages, audit records; never a secret)."""

    def tag_source(self) -> str:
        """The string whose sha256 prefix is the destination's tag in source snapshot names
        (:func:`storage.backup_chain.dest_tag`); stable for one destination however it is spelled."""

    def prepare(self) -> None:
        """Create the destination if it does not exist yet (a directory of mode 0700)."""

    def lock(self) -> ContextManager[Any]:
        """Exclusive use of the destination by one backup or retention run; raises
        :class:`storage.backup_io.BackupError` naming the destination when another holds it."""

    def scan(self) -> Tuple[List[Manifest], List[str], List[str]]:
        """(complete backups' manifests, partial entry names, problems with other entries, each a sentence)."""

    def stage(self, backup_id: str) -> BackupStaging:
        """Start writing backup ``backup_id`` (caller holds :meth:`lock`)."""

    def remove_partial(self, name: str) -> None:
        """Remove a partial entry that :meth:`scan` listed (caller holds :meth:`lock`)."""

    def delete(self, backup_id: str) -> None:
        """Delete a complete backup; it stops being listed before any of its files goes (caller holds
        :meth:`lock`)."""

    def open_file(self, backup_id: str, name: str) -> BinaryIO:
        """Read file ``name`` of complete backup ``backup_id``. Raises OSError (FileNotFoundError when missing)."""

    def local_path(self, backup_id: str, name: str) -> Optional[str]:
        """The path of that file when the destination is a local directory (``rbd import-diff`` reads it
        itself), else None (then the caller streams :meth:`open_file`)."""


def _local(url: str) -> BackupDestination:
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination_local import LocalDirectory

    return LocalDirectory(url)


DESTINATIONS: dict = {"local": _local}
"""Destination kind -> factory ``(url) -> BackupDestination``. A URL ``<scheme>://...`` picks the kind named by its
scheme (``file`` is ``local``); a plain path is ``local``."""

_SCHEME_KIND = {"file": "local"}


def open_destination(dest: Any, what: str = "dest") -> BackupDestination:
    """The destination ``dest`` names: a :class:`BackupDestination` is returned as is; a string is a plain path
    or ``file://`` URL (``local``), or ``<kind>://...`` of a registered kind.

    Args:
        dest: what the user typed (module option ``dest``), or a destination object.
        what: the option's name, for messages.

    Raises:
        UnknownDestination: ``dest: 's3://bucket/x' is a destination of kind s3, which is not one of: local``;
            also for an empty value.
    """
    if not isinstance(dest, str):
        return dest
    if not dest:
        raise UnknownDestination(f"{what}: required, a directory path (destination kinds: "
                                 f"{', '.join(sorted(DESTINATIONS))})")
    scheme = dest.split("://", 1)[0] if "://" in dest else ""
    kind = _SCHEME_KIND.get(scheme, scheme) if scheme else "local"
    factory = DESTINATIONS.get(kind)
    if factory is None:
        raise UnknownDestination(f"{what}: {dest!r} is a destination of kind {kind}, which is not one of: "
                                 f"{', '.join(sorted(DESTINATIONS))} (a directory path)")
    return factory(dest)
