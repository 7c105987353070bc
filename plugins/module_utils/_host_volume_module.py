# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bodies of ``zjusct.cloud.host_volume`` and ``zjusct.cloud.host_volume_info``: root volumes in the host store.

``host_volume`` registers an existing RBD image (a restored backup, a migrated disk) as an owner's root volume,
so that ``cloudvm`` with ``root_volume_claim: <name>`` creates a VM on it; the image is checked and marked by
:func:`._volume_rbd.adopt`. ``host_volume_info`` lists volume records with, for rbd volumes, the connection
settings the backup playbooks hand to ``rbd_backup`` (never a secret: the keyring is a path).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils import _volume_rbd as rbdvol
from ansible_collections.zjusct.cloud.plugins.module_utils._hostconfig import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils._spec import is_dns_label
from ansible_collections.zjusct.cloud.plugins.module_utils._store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils._volume import VolumeError, resolve_image


def host_volume_argument_spec() -> dict:
    return {
        "name": {"type": "str", "required": True},
        "owner": {"type": "str", "required": True},
        "rbd_image": {"type": "str", "required": True},
        "image": {"type": "str"},
        "host_config": {"type": "path"},
    }


def host_volume_info_argument_spec() -> dict:
    return {
        "name": {"type": "str"},
        "owner": {"type": "str"},
        "host_config": {"type": "path"},
    }


def _config(path: Optional[str]) -> HostConfig:
    try:
        return load(path)
    except (OSError, ValueError) as exc:
        raise VolumeError(str(exc)) from exc


def _rbd_settings(cfg: HostConfig) -> Optional[dict]:
    return rbdvol.settings(cfg.rbd).as_dict() if cfg.rbd else None


def _public(cfg: HostConfig, volume: dict) -> dict:
    out = dict(volume)
    if volume.get("driver") == "rbd":
        ref = rbdvol.volume_ref(volume)
        out["rbd"] = dict(_rbd_settings(cfg) or {}, pool=ref.pool, image=ref.image)
    return out


def adopt_volume(params: dict, check_mode: bool = False) -> dict:
    """Register ``params['rbd_image']`` as volume ``name`` of ``owner`` (idempotent).

    Returns:
        ``{"changed": bool, "volume": record}``.

    Raises:
        VolumeError: bad name/owner, the name is taken by another volume, or :func:`._volume_rbd.adopt` refused.
    """
    cfg = _config(params.get("host_config"))
    for field in ("name", "owner"):
        if not is_dns_label(params[field]):
            raise VolumeError(f"{field}: {params[field]!r} is not a DNS label")
    settings = rbdvol.settings(cfg.rbd)
    with HostStore(cfg.store_path) as store:
        existing = store.get_volume(params["name"])
        image = resolve_image(cfg.images_dir, params.get("image") or cfg.default_image)
        wanted = params["rbd_image"] if "/" in params["rbd_image"] else f"{settings.pool}/{params['rbd_image']}"
        if existing is not None:
            if existing["driver"] != "rbd" or existing["location"] != wanted or existing["owner"] != params["owner"]:
                raise VolumeError(f"name: volume {params['name']!r} already exists ({existing['driver']}"
                                  f" {existing['location']}, owner {existing['owner']})")
            return {"changed": False, "volume": _public(cfg, existing)}
        if check_mode:
            return {"changed": True, "volume": {"name": params["name"], "driver": "rbd", "location": wanted,
                                                "owner": params["owner"]}}
        adopted = rbdvol.adopt(cfg.rbd, wanted, params["owner"])
        record = {"name": params["name"], "driver": "rbd", "location": adopted["location"],
                  "size_mib": adopted["size_mib"], "owner": params["owner"], "image": image["dir"]}
        store.put_volume(record)
        store.record_event("Normal", params["name"], "VolumeAdopted",
                           f"RBD image {adopted['location']} registered as volume {params['name']} of"
                           f" {params['owner']} (kernel from {os.path.basename(image['dir'])})")
        return {"changed": True, "volume": _public(cfg, store.get_volume(params["name"]) or record)}


def list_volumes(params: dict) -> dict:
    """Volume records filtered by name and owner, plus the host's volume driver and rbd settings."""
    cfg = _config(params.get("host_config"))
    with HostStore(cfg.store_path) as store:
        items = store.list_volumes()
    items = [v for v in items if (not params.get("name") or v["name"] == params["name"])
             and (not params.get("owner") or v["owner"] == params["owner"])]
    return {"changed": False, "volumes": [_public(cfg, v) for v in items], "volume_driver": cfg.volume_driver,
            "rbd": _rbd_settings(cfg)}


def run(module: Any, body: Any) -> None:
    """Call ``body`` and turn VolumeError into fail_json."""
    try:
        module.exit_json(**body())
    except VolumeError as exc:
        module.fail_json(msg=str(exc))
