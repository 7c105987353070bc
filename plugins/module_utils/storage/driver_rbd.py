# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's ``rbd`` volume driver: the :class:`storage.driver.VolumeDriver` face of :mod:`storage.rbd_clone`.

The data is a Ceph RBD clone ``<pool>/<name>`` of the image set's template ``tmpl-<set>@base``; the claim is
also written as the image-meta ``cloud.zjusct.io/claimed-by`` (seen by other hosts and the backup tools); a
writer is a watcher of the image; QEMU opens it through librbd (``rootDisk.rbd``). The rules and the Ceph
calls are in :mod:`storage.rbd_clone` (and docs/rbd.md); this class only routes the protocol to them.
"""

from __future__ import annotations

from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.storage import rbd_clone as rbdvol
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import VolumeSettings


class RbdDriver:
    """:class:`storage.driver.VolumeDriver` ``rbd``."""

    name = "rbd"

    def check_config(self, data: dict) -> None:
        """``rbd.pool`` is required.

        Raises:
            ValueError: ``host_config: rbd.pool: required when volume_driver is rbd``.
        """
        if not (data.get("rbd") or {}).get("pool"):
            raise ValueError("host_config: rbd.pool: required when volume_driver is rbd")

    def create(self, settings: VolumeSettings, name: str, image: dict, owner: str,
               size_mib: Optional[int]) -> dict:
        """A clone of the image set's template marked with ``owner`` (:func:`storage.rbd_clone.create_clone`; the
        block device is grown to ``size_mib``, the guest's file system is not)."""
        return rbdvol.create_clone(settings.rbd, name, image, owner, size_mib)

    def claim(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """The image-meta mark (:func:`storage.rbd_clone.claim`)."""
        rbdvol.claim(settings.rbd, volume, vm_uid)

    def release(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """Remove the image-meta mark of ``vm_uid`` (:func:`storage.rbd_clone.release`)."""
        rbdvol.release(settings.rbd, volume, vm_uid)

    def claim_mark(self, settings: VolumeSettings, volume: dict) -> Optional[str]:
        """The image-meta mark (:func:`storage.rbd_clone.claim_mark`)."""
        return rbdvol.claim_mark(settings.rbd, volume)

    def writers(self, settings: VolumeSettings, volume: dict) -> list[str]:
        """The image's watchers, as one description (:func:`storage.rbd_clone.writer`)."""
        watcher = rbdvol.writer(settings.rbd, volume)
        return [watcher] if watcher else []

    def boot_blocker(self, settings: VolumeSettings, volume: Optional[dict]) -> Optional[str]:
        """A watcher of the image while no launcher of the VM is alive (a killed QEMU whose watch has not
        expired, another host's VM): librbd would let both write, so the boot waits (phase VolumeInUse)."""
        return rbdvol.writer(settings.rbd, volume)

    def delete(self, settings: VolumeSettings, volume: dict) -> None:
        """Remove the image; refused while it has watchers (:func:`storage.rbd_clone.delete`)."""
        rbdvol.delete(settings.rbd, volume)

    def root_disk(self, settings: VolumeSettings, volume: dict) -> dict:
        """``rootDisk.rbd`` (:func:`storage.rbd_clone.root_disk`)."""
        return rbdvol.root_disk(settings.rbd, volume)

    def describe(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"rbd": {pool, image, conf, user, keyring_path, cluster}}`` for the backup playbooks (the keyring
        is a path, never the key)."""
        ref = rbdvol.volume_ref(volume)
        base = rbdvol.settings(settings.rbd).as_dict() if settings.rbd else {}
        return {"rbd": dict(base, pool=ref.pool, image=ref.image)}

    def backup_source(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"rbd": {pool, image, conf, user, keyring_path, cluster}}`` (as :meth:`describe`)."""
        return self.describe(settings, volume)

    def restore_target(self, settings: VolumeSettings, name: str) -> dict:
        """``{"rbd": {..., pool: <rbd.pool>, image: name}}``.

        Raises:
            VolumeError: the host config has no ``rbd.pool``.
        """
        return {"rbd": dict(rbdvol.settings(settings.rbd).as_dict(), image=name)}
