# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may use a root volume of the host backend: the claim rules, checked at create and at start.

A volume belongs to one owner and is claimed by at most one CloudVM (its uid in the host store's
``volumes.claimed_by``; for rbd volumes also the image-meta ``cloud.zjusct.io/claimed-by``). Deleting a
CloudVM keeps the volume and its claim (docs/host-backend.md "How a start works"), so a claim can outlive its CloudVM.
The rules (:func:`judge`):

1. The volume's owner must be the requesting owner.
2. A CloudVM that exists in the store and holds the volume (its uid is the claim, or - at create - its
   ``spec.rootVolumeClaim`` names the volume) refuses every other CloudVM; the message names it.
3. A claim whose CloudVM no longer exists is stale. It is taken over (released, then claimed by the new
   CloudVM at its first start) only when nothing still writes the volume: no process has the volume file
   open (file and qcow2 drivers), the RBD image has no watcher and no claimed-by mark of another uid (rbd
   driver), and no launcher of the requesting VM's name is alive. What counts as a writer and a mark is the
   volume's driver's (:class:`storage.driver.VolumeDriver` ``writers`` and ``claim_mark``). Otherwise the writer
   is named and the request refused.

Every refusal happens before any record is written. Operator steps: docs/runbooks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import (
    UnknownDriver,
    VolumeDriver,
    VolumeSettings,
    driver,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

RUNBOOK = "docs/runbooks.md, 'Volume claims'"


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`judge`: ``stale_uid`` is a claim to release before the volume is used."""

    stale_uid: Optional[str] = None


def volume_writers(volume: dict, rbd: dict) -> list[str]:
    """Who has the volume open now, as its driver sees it: processes holding the file, or the RBD image's watchers.

    Raises:
        VolumeError: the volume's driver is unknown, the RBD image is missing or its status cannot be read.
    """
    return _driver(volume).writers(VolumeSettings(rbd=rbd), volume)


def _driver(volume: dict) -> VolumeDriver:
    """The driver of a volume record (:func:`storage.driver.driver`), a VolumeError naming the record if unknown."""
    try:
        return driver(volume.get("driver"), f"volume {volume.get('name')!r}: driver")
    except UnknownDriver as exc:
        raise VolumeError(str(exc)) from exc


def _holders(store: HostStore, volume: dict, vm_uid: Optional[str], creating: bool) -> list[dict]:
    out = []
    for vm in store.list_vms():
        uid = vm["metadata"]["uid"]
        if uid == vm_uid:
            continue
        if uid == volume.get("claimed_by") or (creating and vm["spec"].get("rootVolumeClaim") == volume["name"]):
            out.append(vm)
    return out


def judge(store: HostStore, volume: dict, owner: str, vm_uid: Optional[str], *, creating: bool,
          writers: Callable[[], list[str]], rbd_mark: Callable[[], Optional[str]]) -> Verdict:
    """Apply the claim rules (module docstring) for CloudVM ``vm_uid`` (None: not created yet) of ``owner``.

    Args:
        store: the host store (CloudVM records are read, nothing is written).
        volume: the volume record (name, driver, location, owner, claimed_by).
        owner: the requesting CloudVM's ``spec.owner``.
        vm_uid: the requesting CloudVM's uid, or None at create.
        creating: True when no CloudVM record exists yet (then a record naming the volume also holds it).
        writers: returns who has the volume open (called only for a stale claim).
        rbd_mark: returns the claimed-by mark on the volume's storage (the RBD image-meta; None for drivers
            without marks), called only for a stale claim without writer.

    Returns:
        A :class:`Verdict`; ``stale_uid`` set when a stale claim must be released first.

    Raises:
        CloudVMError: refused; the message starts with ``spec.rootVolumeClaim:``, names the volume, the
            holder (CloudVM namespace/name and uid, owner, or the writing process) and the runbook.
    """
    name = volume["name"]
    if volume["owner"] != owner:
        raise CloudVMError(f"spec.rootVolumeClaim: volume {name!r} belongs to owner {volume['owner']!r}, not"
                           f" {owner!r}; choose another VM name (the volume is <name>-root)")
    holders = _holders(store, volume, vm_uid, creating)
    if holders:
        vm = holders[0]
        meta = vm["metadata"]
        raise CloudVMError(
            f"spec.rootVolumeClaim: volume {name!r} is held by CloudVM {meta['namespace']}/{meta['name']} (uid"
            f" {meta['uid']}, owner {vm['spec']['owner']}); delete that VM first (ansible-playbook"
            f" playbooks/vm_delete.yml -e owner={vm['spec']['owner']} -e name={meta['name']}"
            f" -e vm_namespace={meta['namespace']}) or choose another VM name ({RUNBOOK})")
    stale = volume.get("claimed_by")
    if not stale or stale == vm_uid:
        return Verdict()
    busy = writers()
    if busy:
        raise CloudVMError(
            f"spec.rootVolumeClaim: volume {name!r} is claimed by CloudVM uid {stale}, which no longer exists,"
            f" but is still in use by {', '.join(busy)}; stop that writer first ({RUNBOOK})")
    mark = rbd_mark()
    if mark and mark != stale:
        raise CloudVMError(
            f"spec.rootVolumeClaim: volume {name!r} ({volume['location']}) is marked claimed by CloudVM uid"
            f" {mark}, unknown to this host's store (another host?); release it there, or remove the mark"
            f" once no host uses it ({RUNBOOK})")
    return Verdict(stale_uid=stale)


def settle(store: HostStore, volume: dict, owner: str, vm_uid: Optional[str], *, creating: bool, rbd: dict,
           subject: str, launcher_alive: Optional[str] = None, check_mode: bool = False) -> dict:
    """Check the claim rules and release a stale claim (unless ``check_mode``).

    Args:
        launcher_alive: a description of a live launcher of the requesting VM's name (counted as a writer).

    Returns:
        The volume record as it is now (``claimed_by`` cleared when a stale claim was released).

    Raises:
        CloudVMError: refused (see :func:`judge`). VolumeError: the volume's writers or the driver's mark could not
            be read, or the mark not removed.
    """
    def writers() -> list[str]:
        return ([launcher_alive] if launcher_alive else []) + volume_writers(volume, rbd)

    def mark() -> Optional[str]:
        return _driver(volume).claim_mark(VolumeSettings(rbd=rbd), volume)

    verdict = judge(store, volume, owner, vm_uid, creating=creating, writers=writers, rbd_mark=mark)
    if verdict.stale_uid is None or check_mode:
        return volume
    _driver(volume).release(VolumeSettings(rbd=rbd), volume, verdict.stale_uid)
    with store.transaction():
        current = store.get_volume(volume["name"]) or volume
        if current.get("claimed_by") == verdict.stale_uid:
            current = dict(current, claimed_by=None)
            store.put_volume(current)
    store.record_event("Normal", subject, "ClaimReleased",
                       f"volume {volume['name']}: claim of CloudVM uid {verdict.stale_uid}, which no longer exists"
                       " and has no writer, released")
    return current
