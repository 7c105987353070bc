# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the host adapter's writes (:class:`host.cloudvm.HostCloudVMApi`) do that admission does on Kubernetes, besides
the spec's rules: the owner's quota, checked in the very store transaction that writes the spec
(:func:`within_quota`); the root volume of a new CloudVM, found (its claim rules, :mod:`host.volume_claim`) or
created by the host's volume driver, and its growth to ``spec.rootVolumeSizeMiB`` counted in the ``disk_mib`` quota;
and the removal of a root volume, with the checks before deleting one a deleted CloudVM kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.port import RootVolume
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import settle as settle_claim
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import volume_writers
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import driver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import resolve_image


def new_volume_mib(image: Optional[dict], size_mib: Optional[int]) -> int:
    """The size (MiB) a new root volume will have: ``volume_size_mib``, else the image's root file system (0 when the
    image has no ``rootfs.raw``)."""
    if size_mib:
        return int(size_mib)
    source = os.path.join((image or {}).get("dir", ""), "rootfs.raw")
    return os.path.getsize(source) // (1024 * 1024) if os.path.exists(source) else 0


def within_quota(store: HostStore, existing: Optional[dict], planned: dict, new_volume_mib: int = 0) -> None:
    """Refuse a spec change that would take its owner over a quota (docs/security.md, "Quotas").

    Called inside the store transaction that writes ``planned`` (and the new volume's record), so two
    concurrent runs for two VMs of one owner cannot together exceed a quota: the second waits for the
    first's write lock and then counts its VM.

    Args:
        store: the host store (its ``quotas``, ``cloudvms`` and ``volumes`` are read).
        existing: the CloudVM as stored now, or None when ``planned`` creates it.
        planned: the spec about to be written.
        new_volume_mib: MiB of root volume this change creates or grows (0 if none).

    Raises:
        CloudVMError: ``reason: QuotaExceeded`` naming the quota, the owner, in use + requested vs limit.
    """
    owner = planned["owner"]
    before = quota.vm_footprint((existing or {}).get("spec"))
    after = quota.vm_footprint(planned)
    after["disk_mib"] += new_volume_mib
    refusal = quota.check(owner, store.get_quota(owner), store.owner_usage(owner), before, after)
    if refusal is not None:
        raise CloudVMError(refusal.message, **refusal.details())


def volume_growth(volume: Optional[dict], desired: dict) -> int:
    """MiB that ``spec.rootVolumeSizeMiB`` adds to an existing root volume's record (0: unset, or not larger).

    The record holds the volume's allotted size, counted in the owner's ``disk_mib`` quota from the write on; the
    launcher grows the volume itself at the next boot (``rootDisk.sizeMiB``, docs/launcher-protocol.md).

    Raises:
        CloudVMError: the size asked is below the volume's (a root volume only grows), naming both sizes.
    """
    size = desired.get("rootVolumeSizeMiB")
    if size is None or volume is None:
        return 0
    current = int(volume.get("size_mib") or 0)
    if size < current:
        raise CloudVMError(f"spec.rootVolumeSizeMiB: {size} is below the size of the root volume {volume['name']}, "
                           f"{current} MiB; a root volume only grows")
    return size - current


def grow_record(store: HostStore, volume: Optional[dict], desired: dict, growth: int) -> None:
    """Write the grown size of ``volume`` (:func:`volume_growth`) into its record, inside the caller's transaction."""
    if volume is not None and growth > 0:
        store.put_volume(dict(volume, size_mib=desired["rootVolumeSizeMiB"]))


@dataclass(frozen=True)
class RootVolumeAdmission:
    """The root volume of a CloudVM being created: ``volume`` its record when it exists (its claim rules passed),
    else ``image`` the image set (:func:`storage.volume.resolve_image`) it will be made from; ``mib`` the MiB it adds
    to the owner's ``disk_mib`` (the new volume's size, or an existing one's growth)."""

    volume: Optional[dict]
    image: Optional[dict]
    mib: int


def admit_root_volume(cfg: HostConfig, store: HostStore, namespace: str, name: str, desired: dict,
                      root_volume: RootVolume, dry_run: bool) -> RootVolumeAdmission:
    """Find the root volume ``desired["rootVolumeClaim"]`` of a new CloudVM and pass its claim rules, or resolve the
    image a missing one is made from (``root_volume.image``, default the host's image). Checked at create, so that a
    refused create writes no record (docs/runbooks.md, "Volume claims").

    Raises:
        CloudVMError: the claim rules refuse the volume, or it would shrink (:func:`volume_growth`). VolumeError:
            the image is missing, or the volume's writers cannot be read.
    """
    volume = store.get_volume(desired["rootVolumeClaim"])
    if volume is None:
        image = resolve_image(cfg.images_dir, root_volume.image or cfg.default_image)
        return RootVolumeAdmission(None, image, new_volume_mib(image, root_volume.size_mib))
    live = sup.running_boot(cfg.launcher_paths(namespace, name))
    settle_claim(store, volume, desired["owner"], None, creating=True, rbd=cfg.rbd, subject=f"{namespace}/{name}",
                 check_mode=dry_run,
                 launcher_alive=f"a launcher of {namespace}/{name} (pid {live[1]})" if live else None)
    # an existing volume grows to spec.rootVolumeSizeMiB (0 MiB when it is not asked to)
    return RootVolumeAdmission(volume, None, volume_growth(volume, desired))


def admit_root_volume_update(cfg: HostConfig, store: HostStore, existing: dict, desired: dict,
                             dry_run: bool) -> RootVolumeAdmission:
    """The root volume of a CloudVM whose spec ``existing`` becomes ``desired``: its claim rules passed when it exists,
    ``mib`` its growth to ``spec.rootVolumeSizeMiB`` (0 without a volume or growth; ``image`` is always None).

    Raises:
        CloudVMError: the claim rules refuse the volume, or it would shrink (:func:`volume_growth`).
    """
    meta = existing["metadata"]
    volume = store.get_volume(desired["rootVolumeClaim"])
    if volume is not None:
        settle_claim(store, volume, desired["owner"], meta["uid"], creating=False, rbd=cfg.rbd,
                     subject=f"{meta['namespace']}/{meta['name']}", check_mode=dry_run)
    return RootVolumeAdmission(volume, None, volume_growth(volume, desired))


def create_root_volume(cfg: HostConfig, desired: dict, image: dict, size_mib: Optional[int]) -> dict:
    """Make the root volume ``desired["rootVolumeClaim"]`` from ``image`` by the host's driver (``volume_driver``),
    ``size_mib`` MiB (None: the image's size). Returns its store record (not written: the caller's transaction does).

    Raises:
        VolumeError: the volume could not be made. UnknownDriver: the host config's ``volume_driver``.
    """
    created = driver(cfg.volume_driver, "host_config: volume_driver").create(
        cfg.volume_settings(), desired["rootVolumeClaim"], image, desired["owner"], size_mib)
    return {"name": desired["rootVolumeClaim"], "driver": cfg.volume_driver, "owner": desired["owner"],
            "image": image["dir"], **created}


def record_new_volume(store: HostStore, subject: str, volume: dict) -> None:
    """Write a new root volume's record and its ``VolumeCreated`` event on ``subject`` (``<ns>/<name>``), inside the
    caller's transaction."""
    store.put_volume(volume)
    store.record_event("Normal", subject, "VolumeCreated",
                       f"volume {volume['name']} from image {os.path.basename(volume['image'])}")


def remove_volume(cfg: HostConfig, volume: dict) -> None:
    """Delete a root volume's data through its driver (file, RBD image, qcow2 overlay); its record is the caller's.

    Raises:
        VolumeError: the data could not be deleted. UnknownDriver: the record names no registered driver.
    """
    driver(volume["driver"], "volume driver").delete(cfg.volume_settings(), volume)


def admit_kept_volume_delete(cfg: HostConfig, store: HostStore, namespace: str, name: str, volume: dict, owner: str,
                             operator: bool) -> None:
    """Whether ``owner`` may delete ``volume``, the root volume deleting CloudVM ``namespace/name`` kept: it is theirs
    (or an operator acts), no CloudVM holds or names it, and no process writes it.

    Raises:
        CloudVMError: ``reason: Forbidden`` for another owner's volume; a CloudVM holds it or names it as its root
            volume claim, or a process still writes it (:mod:`host.volume_claim`). VolumeError: its writers cannot
            be read.
    """
    claim = volume["name"]
    if volume["owner"] != owner and not operator:
        raise CloudVMError(f"delete_volume: volume {claim!r} (kept by deleting CloudVM {namespace}/{name})"
                           f" belongs to owner {volume['owner']!r}, not {owner!r}", reason="Forbidden")
    live = sup.running_boot(cfg.launcher_paths(namespace, name))
    settle_claim(store, volume, volume["owner"], None, creating=True, rbd=cfg.rbd, subject=f"{namespace}/{name}",
                 check_mode=True,
                 launcher_alive=f"a launcher of {namespace}/{name} (pid {live[1]})" if live else None)
    # the claim rules look for writers only behind a stale claim; a delete needs none at all
    busy = volume_writers(volume, cfg.rbd)
    if busy:
        raise CloudVMError(f"delete_volume: volume {claim!r} is in use by {', '.join(busy)}; stop that"
                           " writer first (docs/runbooks.md, 'Volume claims')")
