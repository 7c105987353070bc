# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The audit records of ``zjusct.cloud.volume_backup`` and ``zjusct.cloud.rbd_backup`` on the host backend
(docs/security.md, "Audit"); their work is :mod:`host.backup`.

With ``host_config`` given, every backup (``state: present``, retention pruning included) and restore
(``state: restored``) is recorded in that host store's ``audit`` table, as the cloudvm module does for its runs:
its intent (``result: requested``) before it touches anything, so a run killed midway leaves its record, then its
outcome in the same record (:class:`host.store.AuditTrail`): ``action`` ``backup`` or ``restore``, ``subject``
``rbd/<pool>/<image>`` (the image backed up, or the new image restored into), ``volume/<name>`` (a file-backed
volume of the host store) or ``<driver>:<path>`` (a file given by path), ``actor`` the ``actor`` option
(else ``owner``, else ``operator``), ``owner`` the backup's owner. A restore that found its image already
restored ends ``succeeded`` with ``unchanged`` in its message. Verification (``state: verified``) and check mode
write nothing. Only named fields go into a record, never the connection options (``ceph_key`` is a secret).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Dict, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, StoreError, audited

ACTIONS = {"present": "backup", "restored": "restore"}


def audit_argument_spec() -> Dict[str, Any]:
    """The options of rbd_backup that only shape its audit record (documented in the module)."""
    return {
        "host_config": {"type": "path"},
        "actor": {"type": "str"},
        "operator": {"type": "bool", "default": False},
    }


def run_audited(p: Dict[str, Any], body: Callable[[], Dict[str, Any]], check_mode: bool = False,
                subject: Optional[str] = None) -> Dict[str, Any]:
    """Run ``body`` (the volume_backup / rbd_backup module's work) and record its outcome in the host store of
    ``host_config``.

    Args:
        p: the module parameters (state, pool, name, target_pool, target_name, dest, vm, owner, backup_id,
            keep, full_every, force_full, keep_snapshots, host_config, actor, operator).
        body: returns the module result (``changed``, ``backup_id``, ``owner``...) or raises.
        check_mode: nothing is recorded.
        subject: the record's subject; default ``rbd/<pool>/<name>`` (backup) or
            ``rbd/<target_pool>/<target_name>`` (restore) from ``p``.

    Returns:
        ``body()``'s result.

    Raises:
        ValueError: ``host_config`` cannot be read or its store cannot be opened (checked before ``body`` runs,
            so a backup is never made that cannot be recorded); whatever ``body`` raises, after recording it.
    """
    action = ACTIONS.get(p.get("state") or "present")
    if not p.get("host_config") or action is None or check_mode:
        return body()
    try:
        store = HostStore(load(p["host_config"]).store_path)
    except (OSError, ValueError, StoreError, sqlite3.Error) as exc:
        raise ValueError(f"host_config: {exc}") from exc
    try:
        subject = subject or _subject(p, action)
        trail = AuditTrail(store, p.get("actor") or p.get("owner") or "operator", action, subject,
                           owner=str(p.get("owner") or ""), operator=bool(p.get("operator")), data=_data(p, action))
        trail.intend(f"{action} of {_what(subject)} requested ({'into' if action == 'backup' else 'from'} "
                     f"{p.get('dest')})")
        return audited(body, lambda **outcome: _record(trail, p, action, **outcome), trail=trail)
    finally:
        store.close()


def _what(subject: str) -> str:
    """The subject without its kind prefix (``rbd/p/i`` -> ``p/i``, ``volume/v`` -> ``volume v``)."""
    kind, _sep, rest = subject.partition("/")
    return rest if kind == "rbd" else f"{kind} {rest}"


def _subject(p: Dict[str, Any], action: str) -> str:
    if action == "backup":
        return f"rbd/{p.get('pool') or 'rbd'}/{p.get('name') or ''}"
    return f"rbd/{p.get('target_pool') or p.get('pool') or 'rbd'}/{p.get('target_name') or ''}"


def _data(p: Dict[str, Any], action: str) -> Dict[str, Any]:
    """The options of one backup or restore that go into its audit record (never a connection option)."""
    data: Dict[str, Any] = {"dest": p.get("dest")}
    keys = (("vm", "volume", "driver", "keep", "full_every", "force_full") if action == "backup"
            else ("backup_id", "keep_snapshots", "target_volume", "target_driver"))
    data.update({k: p[k] for k in keys if p.get(k) is not None})
    return data


def _record(trail: AuditTrail, p: Dict[str, Any], action: str, result: Optional[Dict[str, Any]] = None,
            error: Optional[BaseException] = None) -> None:
    """Record the outcome of one backup or restore in its audit record (schema in docs/security.md, "Audit")."""
    subject = trail.subject
    if error is not None:
        reason = str((getattr(error, "details", {}) or {}).get("reason") or type(error).__name__)
        trail.finish("failed", str(error), reason)
        return
    res = result or {}
    trail.owner = str(res.get("owner") or p.get("owner") or "")
    data: Dict[str, Any] = {k: res[k] for k in ("backup_id", "type", "chain", "image_size_bytes") if k in res}
    if action == "backup":
        pruned = list((res.get("retention") or {}).get("deleted") or [])
        data.update(pruned=pruned, removed_snapshots=list(res.get("removed_snapshots") or []))
        message = (f"backup {res.get('backup_id')} ({res.get('type')}) of {_what(subject)} into {p.get('dest')}"
                   + (f"; pruned {', '.join(pruned)}" if pruned else ""))
    elif not res.get("changed"):
        message = f"unchanged: {res.get('msg') or _what(subject) + ' already restored'}"
    else:
        data["verified_blocks"] = res.get("verified_blocks")
        message = f"backup {res.get('backup_id')} restored into {_what(subject)} for {trail.owner or 'no owner'}"
    trail.finish("succeeded", message, data=data)
