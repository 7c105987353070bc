# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's volume driver seam: what a root volume driver does, and the registry of drivers.

A root volume of the host backend is a record in the host store (``volumes``: name, driver, location,
size_mib, owner, claimed_by, image) plus the data the driver keeps at ``location``. The record's
``driver`` names the :class:`VolumeDriver` that made it and that every later operation on it goes through;
the host config's ``volume_driver`` only picks the driver of **new** volumes. The ownership and claim rules
(who may use a volume) are the driver-independent :mod:`host.volume_claim`; a driver only adds what its
storage needs (a mark on the RBD image, a writer seen by Ceph or in ``/proc``).

Drivers (one module each, registered in :data:`DRIVERS`):

* ``file`` (:mod:`storage.driver_file`): a sparse raw copy of the image set's root file system.
* ``rbd`` (:mod:`storage.driver_rbd`): a Ceph RBD clone of a per-image-set template (:mod:`storage.rbd_clone`).
* ``qcow2`` (:mod:`storage.driver_qcow2`): a qcow2 overlay on a read-only base shared by every volume of the
  image set (instant thin clones).

Adding a driver: write ``storage/driver_<name>.py`` with a class that satisfies :class:`VolumeDriver`, add it to
:data:`DRIVERS`, add the name to the hypervisor role's ``hypervisor_volume_driver`` choices, and test it on
real guests (docs/host-backend.md, "Where to add a volume driver").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8 has no typing.Protocol; only the annotations use it
    Protocol = object  # type: ignore[assignment]


@dataclass(frozen=True)
class VolumeSettings:
    """What the drivers read from the host config (:class:`host.config.HostConfig`).

    Attributes:
        volumes_dir: absolute directory of the file-backed drivers' data (``file``, ``qcow2``).
        rbd: the host config's ``rbd`` dict (pool, conf, user, keyring_path, cluster); empty unless rbd is used.
    """

    volumes_dir: str = ""
    rbd: dict = field(default_factory=dict)


class VolumeDriver(Protocol):
    """One kind of root volume storage. Every method raises :class:`storage.volume.VolumeError` on failure, with a
    message that starts with the user-facing field it is about (``root_volume_claim:``, ``volume_size_mib:``,
    ``rootVolumeClaim:``, ``delete_volume:``, ``host_config:``).

    ``volume`` arguments are host store records (:meth:`host.store.HostStore.get_volume`):
    ``{"name", "driver", "location", "size_mib", "owner", "claimed_by", "image"}``.
    """

    name: str

    def check_config(self, data: dict) -> None:
        """Validate the host config file's keys this driver needs (``data`` is the parsed JSON object).

        Raises:
            ValueError: naming ``host_config: <key>`` and what is required (host.config.load's error type).
        """

    def create(self, settings: VolumeSettings, name: str, image: dict, owner: str,
               size_mib: Optional[int]) -> dict:
        """Make the data of new volume ``name`` from an image set, all or nothing.

        Args:
            name: the volume's name (a DNS label, ``<vm>-root``).
            image: the image set's manifest with ``dir`` (:func:`storage.volume.resolve_image`); its
                ``<dir>/rootfs.raw`` is the guest's root file system (raw ext4).
            owner: the owning user id (drivers that keep marks on the storage write it).
            size_mib: the disk's virtual size in MiB (>= the image's), or None for the image's size.

        Returns:
            ``{"location": str, "size_mib": int}``: where the data is (path, or ``pool/image``) and the disk's
            virtual size in MiB (what placement and the ``disk_mib`` quota count).

        Raises:
            VolumeError: the data already exists, the size is below the image's, or a tool failed; nothing is
                left behind.
        """

    def claim(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """Mark the volume as used by CloudVM ``vm_uid`` on the storage (the store's ``claimed_by`` is the
        caller's). No-op for drivers whose only claim is the store's."""

    def release(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """Undo :meth:`claim` of ``vm_uid`` (a stale claim being taken over); no-op when there is none.

        Raises:
            VolumeError: the storage's mark names another uid.
        """

    def claim_mark(self, settings: VolumeSettings, volume: dict) -> Optional[str]:
        """The CloudVM uid the storage says claims the volume (possibly another host's), or None."""

    def writers(self, settings: VolumeSettings, volume: dict) -> list[str]:
        """Who has the volume's data open now, each a short description (``"pid 12 (qemu-system-x86)"``,
        ``"RBD image p/i has watchers ..."``); empty when nobody. Used before a stale claim is taken over."""

    def boot_blocker(self, settings: VolumeSettings, volume: Optional[dict]) -> Optional[str]:
        """Checked before a boot while no launcher of the VM is alive: another writer that must stop first,
        or None. Drivers whose data QEMU locks itself (image locking on files) return None: a second
        writer then fails the boot with QEMU's own lock error."""

    def delete(self, settings: VolumeSettings, volume: dict) -> None:
        """Remove the volume's data (the record is the caller's); a missing data is no error.

        Raises:
            VolumeError: ``delete_volume:`` the storage refused (an RBD image with watchers).
        """

    def root_disk(self, settings: VolumeSettings, volume: dict) -> dict:
        """The launcher's ``rootDisk`` object for the volume (docs/launcher-protocol.md)."""

    def describe(self, settings: VolumeSettings, volume: dict) -> dict:
        """Extra keys host_volume_info returns for the volume beside its record (never a secret)."""

    def backup_source(self, settings: VolumeSettings, volume: dict) -> dict:
        """What a backup of the volume reads (docs/backup-restore.md): ``{"format": "raw"|"qcow2", "path": str}`` for
        a file-backed volume (:mod:`storage.file_backup`), ``{"rbd": {pool, image, conf, user, keyring_path,
        cluster}}`` for an RBD image (:mod:`storage.backup_io`; the keyring is a path, never the key)."""

    def restore_target(self, settings: VolumeSettings, name: str) -> dict:
        """Where a restore makes a NEW volume ``name`` of this driver, in :meth:`backup_source`'s shape (the path a
        new volume of that name has, or the image ``<rbd.pool>/<name>``).

        Raises:
            VolumeError: ``host_config:`` the driver's settings are missing (no ``rbd.pool``).
        """


class UnknownDriver(CloudError, ValueError):
    """A volume driver name that is not registered (the message names the allowed ones)."""


DRIVER_NAMES = ("file", "rbd", "qcow2")
"""The registered driver names, in the order error messages list them (the keys of :data:`DRIVERS`)."""

DRIVERS: dict = {}
"""Driver name -> :class:`VolumeDriver` instance (filled on first use by :func:`driver`: the driver modules
import this one for :class:`VolumeSettings`, so they are imported here only when a driver is asked for)."""


def _register() -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_file import FileDriver
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_qcow2 import Qcow2Driver
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_rbd import RbdDriver

    for found in (FileDriver(), RbdDriver(), Qcow2Driver()):
        DRIVERS[found.name] = found


def driver(name: Optional[str], what: str = "volume_driver") -> VolumeDriver:
    """The driver registered as ``name`` (a volume record's ``driver`` or the host config's ``volume_driver``).

    Raises:
        UnknownDriver: ``<what>: <name> is not one of file, rbd, qcow2``.
    """
    if not DRIVERS:
        _register()
    found = DRIVERS.get(name or "")
    if found is None:
        raise UnknownDriver(f"{what}: {name!r} is not one of {', '.join(DRIVER_NAMES)}")
    return found
