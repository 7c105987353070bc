# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backups of a volume of any driver, their verification and restores into a NEW volume of any driver,
registered for its owner in the host store: the work of ``zjusct.cloud.volume_backup`` (:func:`volume_backup`), of
which ``zjusct.cloud.rbd_backup`` is the RBD-only case (:func:`rbd_backup`), and their one argument spec
(:func:`backup_argument_spec`). The modules' bodies (``volume_backup_module.run_volume_backup``,
``rbd_backup_module.run_rbd_backup``) run them and record each as an Event of a CloudVM on Kubernetes.

Where the bytes come from and go is the driver's (:meth:`storage.driver.VolumeDriver.backup_source` /
``restore_target``): an RBD image goes through :mod:`storage.backup_io` (``rbd export-diff`` / ``import-diff``), a
file-backed volume (``file``, ``qcow2``) through :mod:`storage.file_backup`. Every form writes and reads the same
backups (one ``rbd diff v1`` stream per backup, the same manifest and chain), so a backup of one driver restores
into another. Where backups are kept is a destination (:func:`storage.destination.open_destination`).

The source of a backup is named one of three ways: ``volume`` (a volume of the host store: its driver and location
from the record, its owner checked against ``owner``), ``path`` (a file-backed volume's file, ``driver`` file or
qcow2), or ``pool``/``name`` (an RBD image). The target of a restore likewise: ``target_volume`` (a new volume of
the host store, of ``target_driver``, default the host config's ``volume_driver``, registered for the owner:
owner marks and the ``disk_mib`` quota checked on this receiving host, docs/security.md "Quotas"), ``target_path``
or ``target_pool``/``target_name`` (unregistered).

Audit (with ``host_config``): each backup and restore is a record (:mod:`host.backup_audit`), the registration of a
restored volume a ``volume-register`` record as ``host_volume`` writes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host.backup_audit import run_audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import (
    adopt_volume,
    within_disk_quota,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import file_backup as fb
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.destination import open_destination
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import DRIVER_NAMES, UnknownDriver, driver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import (
    Connection,
    ImageRef,
    Rbd,
    check_name,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_clone import settings as rbd_settings
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError, resolve_image

MiB = 1024 * 1024
RESTORED_EVENT = "VolumeRestored"
FILE_DRIVERS = ("file", "qcow2")
"""Drivers whose data is a local file (their backups and restores run here, :mod:`storage.file_backup`)."""


def _config(params: Dict[str, Any]) -> HostConfig:
    try:
        return load(params.get("host_config"))
    except (OSError, ValueError) as exc:
        raise CloudError(f"host_config: {exc}") from exc


def _one_of(params: Dict[str, Any], keys: tuple, state: str) -> str:
    given = [k for k in keys if params.get(k)]
    if len(given) != 1:
        raise CloudError(f"state={state} needs exactly one of {', '.join(keys)} (got "
                         f"{', '.join(given) or 'none'})")
    return given[0]


def _ranges(params: Dict[str, Any]) -> None:
    for key, lo in (("keep", 1), ("full_every", 1)):
        val = params.get(key)
        if val is not None and not lo <= val <= 10000:
            raise CloudError(f"{key}: {val} is outside the range {lo}-10000")


def _rbd_client(params: Dict[str, Any], rbd: Optional[dict]) -> Rbd:
    """The rbd client: the host config's ``rbd`` settings for a host store volume, else the ceph_* options."""
    if rbd:
        conn = rbd_settings(rbd).connection(float(params.get("timeout") or 3600))
        return Rbd(conn)
    return Rbd(Connection.from_params(params))


# -- the source of a backup -------------------------------------------------------------------------------------

def _source(params: Dict[str, Any]) -> Dict[str, Any]:
    """Resolve the backup source: ``{"driver", "volume" (name or None), "format"/"path" or "ref"/"rbd",
    "owner", "subject", "refusal"}``. A host store volume's owner must be ``owner`` unless ``operator``: else
    ``refusal`` is the message :func:`_backup` raises (in the audited body)."""
    form = _one_of(params, ("volume", "path", "name"), "present")
    if form == "volume":
        cfg = _config(params)
        with HostStore(cfg.store_path, read_only=True) as store:
            record = store.get_volume(params["volume"])
        if record is None:
            raise CloudError(f"volume: {params['volume']!r} is not a volume in the host store {cfg.store_path}")
        owner = params.get("owner")
        refusal = None
        if owner and owner != record["owner"] and not params.get("operator"):
            refusal = (f"owner: {owner!r} is not the owner {record['owner']!r} of volume {record['name']!r}; a "
                       "volume is backed up only by its owner, or by an operator (operator=true)")
        try:
            found = driver(record["driver"], f"volume {record['name']!r}: driver")
        except UnknownDriver as exc:
            raise CloudError(str(exc)) from exc
        src = found.backup_source(cfg.volume_settings(), record)
        out: Dict[str, Any] = {"driver": record["driver"], "volume": record["name"], "owner": record["owner"],
                               "refusal": refusal}
        if "rbd" in src:
            ref = ImageRef(src["rbd"]["pool"], src["rbd"]["image"])
            return dict(out, ref=ref, rbd=cfg.rbd, subject=f"rbd/{ref.spec}")
        return dict(out, format=src["format"], path=src["path"], subject=f"volume/{record['name']}")
    if form == "path":
        kind = params.get("driver") or "file"
        if kind not in FILE_DRIVERS:
            raise CloudError(f"driver: {kind!r} with path: a file-backed volume is one of {', '.join(FILE_DRIVERS)}")
        path = os.path.abspath(params["path"])
        return {"driver": kind, "volume": None, "format": "raw" if kind == "file" else "qcow2", "path": path,
                "owner": params.get("owner"), "subject": f"{kind}:{path}"}
    if (params.get("driver") or "rbd") != "rbd":
        raise CloudError(f"driver: {params.get('driver')!r} with pool/name: an RBD image is driver rbd")
    ref = ImageRef(check_name("pool", params.get("pool") or "rbd"), check_name("name", params["name"]))
    return {"driver": "rbd", "volume": None, "ref": ref, "rbd": None, "owner": params.get("owner"),
            "subject": f"rbd/{ref.spec}"}


def _backup(params: Dict[str, Any], src: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    if src.get("refusal"):  # raised inside the audited body: a refused backup is an audit record too
        raise CloudError(src["refusal"], reason="Forbidden")
    common = dict(vm=params.get("vm"), owner=params.get("owner") or src["owner"], keep=params.get("keep"),
                  full_every=params.get("full_every") or 7, force_full=bool(params.get("force_full")),
                  check_mode=check_mode, verify=params.get("verify", True) is not False)
    if src["driver"] == "rbd":
        res = bio.backup(_rbd_client(params, src["rbd"]), src["ref"], params["dest"],
                         allow_watchers=bool(params.get("allow_watchers")),
                         watcher_grace_seconds=float(params.get("watcher_grace_seconds", 35)), volume=src["volume"],
                         **common)
    else:
        res = fb.backup_volume(src["path"], src["format"], params["dest"], driver=src["driver"],
                               volume=src["volume"], **common)
    return bio.backup_result(res, src["driver"], src["volume"])


# -- the target of a restore ------------------------------------------------------------------------------------

def _target(params: Dict[str, Any]) -> Dict[str, Any]:
    """Resolve the restore target: ``{"driver", "volume" (name or None), "format"/"path" or "ref"/"rbd",
    "subject"}``."""
    form = _one_of(params, ("target_volume", "target_path", "target_name"), "restored")
    kind = params.get("target_driver")
    if kind is not None and kind not in DRIVER_NAMES:
        raise CloudError(f"target_driver: {kind!r} is not one of {', '.join(DRIVER_NAMES)}")
    if form == "target_volume":
        cfg = _config(params)
        name = params["target_volume"]
        problem = dns_label_problem("target_volume", name)
        if problem:
            raise CloudError(problem)
        kind = kind or cfg.volume_driver
        try:
            tgt = driver(kind, "target_driver").restore_target(cfg.volume_settings(), name)
        except (UnknownDriver, VolumeError) as exc:
            raise CloudError(f"target_driver {kind}: {exc}") from exc
        out: Dict[str, Any] = {"driver": kind, "volume": name, "config": cfg}
        if "rbd" in tgt:
            ref = ImageRef(tgt["rbd"]["pool"], tgt["rbd"]["image"])
            return dict(out, ref=ref, rbd=cfg.rbd, subject=f"rbd/{ref.spec}")
        return dict(out, format=tgt["format"], path=tgt["path"], subject=f"volume/{name}")
    if form == "target_path":
        kind = kind or "file"
        if kind not in FILE_DRIVERS:
            raise CloudError(f"target_driver: {kind!r} with target_path: a file-backed volume is one of "
                             f"{', '.join(FILE_DRIVERS)}")
        path = os.path.abspath(params["target_path"])
        return {"driver": kind, "volume": None, "format": "raw" if kind == "file" else "qcow2", "path": path,
                "subject": f"{kind}:{path}"}
    if (kind or "rbd") != "rbd":
        raise CloudError(f"target_driver: {kind!r} with target_name: an RBD image is driver rbd")
    ref = ImageRef(check_name("target_pool", params.get("target_pool") or params.get("pool") or "rbd"),
                   check_name("target_name", params["target_name"]))
    return {"driver": "rbd", "volume": None, "ref": ref, "rbd": None, "subject": f"rbd/{ref.spec}"}


def _restore(params: Dict[str, Any], tgt: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    owner, operator = params.get("owner"), bool(params.get("operator"))
    if tgt["driver"] == "rbd":
        res = bio.restore(_rbd_client(params, tgt["rbd"]), params["dest"], tgt["ref"], params.get("backup_id"),
                          owner=owner, keep_snapshots=bool(params.get("keep_snapshots")), check_mode=check_mode,
                          operator=operator)
        if "size_bytes" in res:
            res["image_size_bytes"] = res.pop("size_bytes")
        return dict(res, driver="rbd", location=tgt["ref"].spec)
    if tgt["volume"]:
        done = _already_restored(tgt, params)
        if done is not None:
            return done
        _admit(tgt, params, owner, operator)
    res = fb.restore_volume(params["dest"], tgt["path"], tgt["format"], params.get("backup_id"), owner=owner,
                            operator=operator, check_mode=check_mode)
    res["image_size_bytes"] = res.pop("size_bytes")
    return dict(res, driver=tgt["driver"], location=tgt["path"])


def _already_restored(tgt: Dict[str, Any], params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """An unchanged result when ``target_volume`` is already this backup's restore for this owner; None when the
    volume does not exist. Refuses (CloudError) a volume of that name that is anything else."""
    cfg = tgt["config"]
    with HostStore(cfg.store_path) as store:
        record = store.get_volume(tgt["volume"])
        events = store.events(tgt["volume"], limit=1000) if record else []
    if record is None:
        return None
    # the event written with this record (a volume of the same name made later has a newer created_at)
    restored = [e for e in events if e.get("reason") == RESTORED_EVENT and e.get("ts", "") >= record["created_at"]]
    last = restored[-1] if restored else None
    data = (last or {}).get("data") or {}
    wanted = params.get("backup_id")
    same = (record["driver"] == tgt["driver"] and record["location"] == tgt["path"]
            and (not params.get("owner") or record["owner"] == params["owner"]) and last is not None
            and (wanted is None or data.get("backup_id") == wanted))
    if not same:
        raise CloudError(f"target_volume: volume {tgt['volume']!r} already exists ({record['driver']} "
                         f"{record['location']}, owner {record['owner']}); restore only into a new volume")
    return {"changed": False, "backup_id": data.get("backup_id"), "driver": record["driver"],
            "location": record["location"], "path": record["location"], "owner": record["owner"],
            "verified_blocks": 0, "msg": f"volume {tgt['volume']} already restored from backup "
                                         f"{data.get('backup_id')}"}


def _admit(tgt: Dict[str, Any], params: Dict[str, Any], owner: Optional[str], operator: bool) -> None:
    """Before any byte is written: the owner is a DNS label and the backup's (or an operator acts), and the restored
    volume fits the owner's ``disk_mib`` quota (VolumeQuotaError, ``reason: QuotaExceeded``)."""
    last = bio.load_chain(params["dest"], params.get("backup_id"))[-1]
    bio.check_restore_owner(last, owner, operator)
    who = owner or last.owner
    problem = dns_label_problem("owner", who, f"the owner of the restored volume {tgt['volume']}; give owner")
    if problem:
        raise CloudError(problem)
    with HostStore(tgt["config"].store_path) as store:
        within_disk_quota(store, who, tgt["path"], -(-last.image_size // MiB))


def _register(params: Dict[str, Any], tgt: Dict[str, Any], res: Dict[str, Any]) -> Dict[str, Any]:
    """Record a restored file-backed volume as the owner's (the quota checked again in the transaction that
    records it); over the quota the restored file is removed. Audited as ``volume-register``."""
    cfg: HostConfig = tgt["config"]
    name, owner = tgt["volume"], str(res.get("owner") or "")
    image = resolve_image(cfg.images_dir, params.get("image") or cfg.default_image)
    size_mib = -(-int(res["image_size_bytes"]) // MiB)
    record = {"name": name, "driver": tgt["driver"], "location": tgt["path"], "size_mib": size_mib,
              "owner": owner, "image": image["dir"]}
    with HostStore(cfg.store_path) as store:
        trail = AuditTrail(store, params.get("actor") or owner, "volume-register", f"volume/{name}", owner=owner,
                           data={"location": tgt["path"], "driver": tgt["driver"], "backup_id": res["backup_id"]})

        def body() -> Dict[str, Any]:
            try:
                with store.transaction():
                    if store.get_volume(name) is not None:
                        raise CloudError(f"target_volume: volume {name!r} appeared in the host store during the "
                                         "restore; restore only into a new volume")
                    within_disk_quota(store, owner, tgt["path"], size_mib)
                    store.put_volume(record)
                    store.record_event("Normal", name, RESTORED_EVENT,
                                       f"backup {res['backup_id']} restored as {tgt['driver']} volume {name} of "
                                       f"{owner} ({tgt['path']})", {"backup_id": res["backup_id"]})
                    trail.intend(f"volume {name} registration requested: {tgt['driver']} {tgt['path']} of {owner}")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tgt["path"])  # nothing half-created: the restored file is no one's
                raise
            return {"changed": True, "volume": store.get_volume(name) or record}

        def record_outcome(result: Optional[Dict[str, Any]] = None, error: Optional[BaseException] = None) -> None:
            if error is None:
                trail.finish("succeeded", f"volume {name} registered: {tgt['driver']} {tgt['path']} of {owner}",
                             data={"size_mib": size_mib})
                return
            reason = str((getattr(error, "details", {}) or {}).get("reason") or type(error).__name__)
            trail.finish("refused" if reason == "QuotaExceeded" else "failed", str(error), reason)

        return audited(body, record_outcome, trail=trail)["volume"]


# -- the modules -------------------------------------------------------------------------------------------------

VOLUME_FORMS = ("volume", "path", "driver", "target_volume", "target_driver", "target_path", "image")
"""volume_backup's options that rbd_backup has not: the host store and file forms and the drivers."""


def backup_argument_spec(any_driver: bool) -> Dict[str, Any]:
    """The options of ``zjusct.cloud.volume_backup`` (``any_driver``) or of ``zjusct.cloud.rbd_backup``, without
    ``event`` and the Kubernetes connection options (``k8s.backup_events.event_argument_spec``, added by the
    bodies); documented in the modules, the options both document alike in the doc fragment
    ``zjusct.cloud.volume_backup``.

    rbd_backup's options are volume_backup's without :data:`VOLUME_FORMS`, and its ``dest`` is a path where
    volume_backup's is a string (a path or a ``file://`` URL).
    """
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.backup_audit import audit_argument_spec
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import connection_argument_spec

    drivers = list(DRIVER_NAMES)
    spec = dict(
        state=dict(type="str", default="present", choices=["present", "verified", "restored"]),
        dest=dict(type="str" if any_driver else "path", required=True),
        volume=dict(type="str"),
        path=dict(type="path"),
        driver=dict(type="str", choices=drivers),
        pool=dict(type="str", default="rbd"),
        name=dict(type="str"),
        keep=dict(type="int"),
        full_every=dict(type="int", default=7),
        force_full=dict(type="bool", default=False),
        allow_watchers=dict(type="bool", default=False),
        watcher_grace_seconds=dict(type="float", default=35),
        vm=dict(type="str"),
        owner=dict(type="str"),
        backup_id=dict(type="str"),
        target_volume=dict(type="str"),
        target_driver=dict(type="str", choices=drivers),
        target_path=dict(type="path"),
        target_pool=dict(type="str"),
        target_name=dict(type="str"),
        image=dict(type="str"),
        keep_snapshots=dict(type="bool", default=False),
        verify=dict(type="bool", default=True),
        **audit_argument_spec(),
        **connection_argument_spec(),
    )
    if any_driver:
        return spec
    rbd = {}
    for key, option in spec.items():  # rbd_backup's own order: dest after the image
        if key not in VOLUME_FORMS and key != "dest":
            rbd[key] = option
        if key == "name":
            rbd["dest"] = spec["dest"]
    return rbd


def volume_backup(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The work of ``zjusct.cloud.volume_backup`` (module docstring): dispatch on ``state``, audited in the host
    store of ``host_config`` (:func:`host.backup_audit.run_audited`).

    Returns:
        The module result (the RETURN keys of plugins/modules/volume_backup.py).

    Raises:
        BackupError (its ``problems`` in the failure result), VolumeQuotaError (``reason: QuotaExceeded``), RbdError,
        or CloudError naming the option for a bad parameter, destination or ``host_config``.
    """
    _ranges(params)
    state = params.get("state") or "present"
    try:
        open_destination(params.get("dest") or "")
        if state == "verified":
            return bio.verify_result(params["dest"], params.get("backup_id"))
        if state == "present":
            src = _source(params)
            return run_audited(dict(params, volume=src["volume"], driver=src["driver"]),
                               lambda: _backup(params, src, check_mode), check_mode, subject=src["subject"])
        tgt = _target(params)
        audit_params = dict(params, target_volume=tgt["volume"], target_driver=tgt["driver"])
        res = run_audited(audit_params, lambda: _restore(params, tgt, check_mode), check_mode,
                          subject=tgt["subject"])
        if tgt["volume"] and not check_mode:
            if tgt["driver"] == "rbd":
                adopted = adopt_volume({"name": tgt["volume"], "owner": res.get("owner") or params.get("owner"),
                                        "rbd_image": tgt["ref"].spec, "image": params.get("image"),
                                        "actor": params.get("actor"), "host_config": params.get("host_config")})
                res["volume"] = adopted["volume"]
                res["changed"] = bool(res.get("changed") or adopted["changed"])
            elif res.get("changed"):
                res["volume"] = _register(params, tgt, res)
        return res
    except CloudError:
        raise
    except ValueError as exc:
        raise CloudError(str(exc)) from exc


def rbd_backup(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The work of ``zjusct.cloud.rbd_backup``: :func:`volume_backup` with an RBD image (``pool``/``name``,
    ``target_pool``/``target_name``) and the ceph_* connection options; its results keep rbd_backup's keys (those of
    volume_backup without ``driver``, ``volume``, ``location``).

    Raises:
        as :func:`volume_backup`.
    """
    p = dict(params, driver="rbd", volume=None, path=None, target_volume=None, target_path=None,
             target_driver="rbd")
    res = volume_backup(p, check_mode)
    for key in ("driver", "volume", "location"):
        res.pop(key, None)
    return res
