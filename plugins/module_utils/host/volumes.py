# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Root volumes in the host store, as the bodies of ``zjusct.cloud.host_volume`` (:func:`adopt_volume`) and
``zjusct.cloud.host_volume_info`` (:func:`list_volumes`) and the restores of ``zjusct.cloud.volume_backup``
(:func:`adopt_volume`, :func:`within_disk_quota`) use them.

``host_volume`` registers an existing RBD image (a restored backup, a migrated disk) as an owner's root volume,
so that ``cloudvm`` with ``root_volume_claim: <name>`` creates a VM on it; the image is checked and marked by
:func:`storage.rbd_clone.adopt`. ``host_volume_info`` lists volume records with what their driver adds
(:meth:`storage.driver.VolumeDriver.describe`): for rbd volumes the connection settings the backup playbooks hand
to ``rbd_backup`` (never a secret: the keyring is a path), for qcow2 volumes their base.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load, resolve_path
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, audited
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import rbd_clone as rbdvol
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import UnknownDriver, driver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError, resolve_image


def _config(path: Optional[str]) -> HostConfig:
    try:
        return load(path)
    except (OSError, ValueError) as exc:
        raise VolumeError(str(exc)) from exc


def _rbd_settings(cfg: HostConfig) -> Optional[dict]:
    return rbdvol.settings(cfg.rbd).as_dict() if cfg.rbd else None


def _public(cfg: HostConfig, volume: dict) -> dict:
    """The record plus what its driver adds (:meth:`storage.driver.VolumeDriver.describe`: ``rbd`` settings for rbd
    volumes, the ``base`` of qcow2 overlays)."""
    try:
        extra = driver(volume.get("driver"), f"volume {volume.get('name')!r}: driver").describe(
            cfg.volume_settings(), volume)
    except UnknownDriver as exc:
        raise VolumeError(str(exc)) from exc
    return dict(volume, **extra)


class VolumeQuotaError(VolumeError):
    """A registration refused over the owner's ``disk_mib`` quota; ``details`` are the result's failure fields."""

    def __init__(self, message: str, details: dict) -> None:
        super().__init__(message)
        self.details = details


def within_disk_quota(store: HostStore, owner: str, location: str, size_mib: int) -> None:
    """Refuse registering a ``size_mib`` volume for ``owner`` over its ``disk_mib`` quota (docs/security.md, "Quotas").

    Raises:
        VolumeQuotaError: ``reason: QuotaExceeded`` with the cloudvm refusal's message and fields.
    """
    after = quota.zero()
    after["disk_mib"] = size_mib
    refusal = quota.check(owner, store.get_quota(owner), store.owner_usage(owner), quota.zero(), after)
    if refusal is not None:
        refusal = replace(refusal, asked_by=f"rbd_image (the size of {location})")
        raise VolumeQuotaError(refusal.message, refusal.details())


def adopt_volume(params: dict, check_mode: bool = False) -> dict:
    """Register ``params['rbd_image']`` as volume ``name`` of ``owner`` (idempotent).

    The owner's ``disk_mib`` quota is checked with the image's size before the image is marked, and again in
    the store write transaction that records the volume (a concurrent run may have taken the quota meanwhile;
    then the owner mark this run wrote is removed again). A registration that changed something, was refused
    or failed is an audit record (``volume-register``, subject ``volume/<name>``, docs/security.md "Audit");
    a run that changed nothing and check mode write none. Check mode does not read the image, so it cannot
    predict a quota refusal.

    Returns:
        ``{"changed": bool, "volume": record}``.

    Raises:
        VolumeError: bad name/owner, the name is taken by another volume, or :func:`storage.rbd_clone.adopt` refused;
            VolumeQuotaError (``reason: QuotaExceeded``) over the owner's disk quota.
    """
    cfg = _config(params.get("host_config"))
    for field in ("name", "owner"):
        problem = dns_label_problem(field, params[field])
        if problem:
            raise VolumeError(problem)
    settings = rbdvol.settings(cfg.rbd)
    wanted = params["rbd_image"] if "/" in params["rbd_image"] else f"{settings.pool}/{params['rbd_image']}"
    with HostStore(cfg.store_path) as store:
        data: dict = {"rbd_image": wanted, **({"image": params["image"]} if params.get("image") else {})}
        trail = AuditTrail(store, params.get("actor") or params["owner"], "volume-register",
                           f"volume/{params['name']}", owner=params["owner"], data=data)
        return audited(lambda: _adopt(cfg, store, params, wanted, check_mode, trail),
                       lambda result=None, error=None: _audit(trail, params, (result or {}).get("volume"), error),
                       check_mode, trail)


def _adopt(cfg: HostConfig, store: HostStore, params: dict, wanted: str, check_mode: bool,
           trail: AuditTrail) -> dict:
    name, owner = params["name"], params["owner"]
    existing = store.get_volume(name)
    image = resolve_image(cfg.images_dir, params.get("image") or cfg.default_image)
    if existing is not None:
        _same_or_refuse(existing, name, owner, wanted)
        return {"changed": False, "volume": _public(cfg, existing)}
    if check_mode:
        return {"changed": True, "volume": {"name": name, "driver": "rbd", "location": wanted, "owner": owner}}
    adopted = rbdvol.adopt(cfg.rbd, wanted, owner,
                           admit=lambda size_mib: within_disk_quota(store, owner, wanted, size_mib))
    record = {"name": name, "driver": "rbd", "location": adopted["location"],
              "size_mib": adopted["size_mib"], "owner": owner, "image": image["dir"]}
    try:
        with store.transaction():  # the quota check and the record it admits: one transaction
            again = store.get_volume(name)
            if again is not None:  # a concurrent run registered the name meanwhile
                _same_or_refuse(again, name, owner, adopted["location"])
            else:
                within_disk_quota(store, owner, adopted["location"], int(adopted["size_mib"]))
                store.put_volume(record)
                store.record_event("Normal", name, "VolumeAdopted",
                                   f"RBD image {adopted['location']} registered as volume {name} of"
                                   f" {owner} (kernel from {os.path.basename(image['dir'])})")
                trail.intend(f"volume {name} registration requested: RBD image {adopted['location']} of {owner}",
                             {"rbd_image": adopted["location"]})
    except VolumeError:
        if adopted["changed"]:  # this run wrote the owner mark: leave the image as it was
            with contextlib.suppress(VolumeError):
                rbdvol.unmark_owner(cfg.rbd, adopted["location"])
        raise
    if again is not None:
        return {"changed": False, "volume": _public(cfg, again)}
    return {"changed": True, "volume": _public(cfg, store.get_volume(name) or record)}


def _same_or_refuse(existing: dict, name: str, owner: str, location: str) -> None:
    if existing["driver"] != "rbd" or existing["location"] != location or existing["owner"] != owner:
        raise VolumeError(f"name: volume {name!r} already exists ({existing['driver']}"
                          f" {existing['location']}, owner {existing['owner']})")


def _audit(trail: AuditTrail, params: dict, volume: Optional[dict] = None,
           error: Optional[BaseException] = None) -> None:
    """Record one host_volume registration's outcome: it changed something, was refused or failed
    (docs/security.md, "Audit"); the intent was recorded in the transaction that wrote the volume's record."""
    name, owner = params["name"], params["owner"]
    if error is None:
        trail.finish("succeeded", f"volume {name} registered: RBD image {trail.data['rbd_image']} of {owner}",
                     data={"size_mib": (volume or {}).get("size_mib")})
        return
    details = getattr(error, "details", {}) or {}
    reason = str(details.get("reason") or type(error).__name__)
    trail.finish("refused" if reason in ("Forbidden", "QuotaExceeded") else "failed", str(error), reason)


def list_volumes(params: dict) -> dict:
    """Volume records filtered by name and owner, plus the host's volume driver and rbd settings."""
    cfg = _config(params.get("host_config"))
    with HostStore(cfg.store_path) as store:
        items = store.list_volumes()
    items = [v for v in items if (not params.get("name") or v["name"] == params["name"])
             and (not params.get("owner") or v["owner"] == params["owner"])]
    return {"changed": False, "volumes": [_public(cfg, v) for v in items], "volume_driver": cfg.volume_driver,
            "rbd": _rbd_settings(cfg), "host_config": config_path(params.get("host_config"))}


def config_path(path: Optional[str]) -> Optional[str]:
    """The host configuration file that :func:`host.config.load` reads for ``path``, or None (no file: defaults).

    The file is :func:`host.config.resolve_path`'s, made absolute. The backup playbooks hand it to
    ``rbd_backup``'s ``host_config`` so that backups and restores are audited in this host's store.
    """
    target, _named = resolve_path(path)
    return os.path.abspath(target) if os.path.exists(target) else None


def root_volume_info(params: dict) -> dict:
    """The host half of ``zjusct.cloud.root_volume_info``: the host store's volume ``name`` (the store's volume names
    are host-wide: ``namespace`` is not used) as :func:`list_volumes` describes it, the host configuration's driver of
    new root volumes, and its path (the backup playbooks pass it on so that backups are audited in this store).

    Raises:
        VolumeError: the host configuration or a record's driver cannot be read.
    """
    listed = list_volumes({"name": params["name"], "host_config": params.get("host_config")})
    volume = listed["volumes"][0] if listed["volumes"] else None
    return {"changed": False, "volume": volume,
            "missing": "" if volume else f"no volume {params['name']} in the host store",
            "volume_driver": listed["volume_driver"], "rbd_image": None, "host_config": listed["host_config"]}
