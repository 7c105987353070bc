# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's ``file`` volume driver: a sparse raw copy of the image set's root file system.

The data is ``<volumes_dir>/<name>.raw`` (:func:`storage.volume.create_from_image`: a reflink or sparse copy of
``rootfs.raw``, grown with ``resize2fs`` when a larger size is asked for). The claim lives in the host store
only; a writer is a process holding the file open (``/proc/<pid>/fd``); QEMU's image locking refuses a second
writer at boot. The launcher opens it as a raw file.
"""

from __future__ import annotations

import os
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import VolumeSettings
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import (
    create_from_image,
    file_writers,
    volume_path,
)


class FileDriver:
    """:class:`storage.driver.VolumeDriver` ``file``."""

    name = "file"

    def check_config(self, data: dict) -> None:
        """Nothing beyond ``volumes_dir`` (which has a default)."""

    def create(self, settings: VolumeSettings, name: str, image: dict, owner: str,
               size_mib: Optional[int]) -> dict:
        """A sparse copy of ``rootfs.raw`` grown to ``size_mib`` (file system included); see the protocol."""
        return create_from_image(settings.volumes_dir, name, image, size_mib)

    def claim(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """The store's ``claimed_by`` is the only claim."""

    def release(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        """The store's ``claimed_by`` is the only claim."""

    def claim_mark(self, settings: VolumeSettings, volume: dict) -> Optional[str]:
        """No mark on the storage: None."""
        return None

    def writers(self, settings: VolumeSettings, volume: dict) -> list[str]:
        """Processes holding ``location`` open (:func:`storage.volume.file_writers`)."""
        return file_writers(volume["location"])

    def boot_blocker(self, settings: VolumeSettings, volume: Optional[dict]) -> Optional[str]:
        """None: QEMU's image locking refuses a second writer of the file."""
        return None

    def delete(self, settings: VolumeSettings, volume: dict) -> None:
        """Unlink ``location`` (a missing file is no error)."""
        if os.path.exists(volume["location"]):
            os.unlink(volume["location"])

    def root_disk(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"path": location, "cache": "Writeback"}`` (format raw, the launcher's default)."""
        return {"path": volume["location"], "cache": "Writeback"}

    def describe(self, settings: VolumeSettings, volume: dict) -> dict:
        """Nothing beyond the record."""
        return {}

    def backup_source(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"format": "raw", "path": location}``: the file as the guest sees it."""
        return {"format": "raw", "path": volume["location"]}

    def restore_target(self, settings: VolumeSettings, name: str) -> dict:
        """``{"format": "raw", "path": <volumes_dir>/<name>.raw}`` (where :meth:`create` puts a volume)."""
        return {"format": "raw", "path": volume_path(settings.volumes_dir, name)}
