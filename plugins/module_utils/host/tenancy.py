# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tenancy records of the host store: an owner's quota and the audit trail.

:func:`set_quota` sets or removes one owner's quota in the host store (the rules of what counts are in
:mod:`model.quota` and docs/security.md); every change is an audit record. It is the host backend's half of
``zjusct.cloud.owner_quota`` (its body: ``owner_quota_module.run_owner_quota``). :func:`list_audit` lists the audit
trail that the cloudvm module and ``owner_quota`` write, newest ``limit`` records oldest first (the body of
``zjusct.cloud.audit_info``: ``host.audit_info_module.run_audit_info``).
"""

from __future__ import annotations

import os
import re
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore, StoreError
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem

_SINCE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z)?$")


class TenancyError(CloudError):
    """A request of owner_quota / audit_info that cannot be carried out."""


def _config(path: Optional[str]) -> HostConfig:
    try:
        return load(path)
    except (OSError, ValueError) as exc:
        raise TenancyError(f"host_config: {exc}") from exc


def set_quota(params: dict, check_mode: bool = False, diff: bool = False) -> dict:
    """Make ``params['owner']``'s quota the limits given (``state: present``) or none (``absent``).

    Every limit omitted is unlimited: the row holds exactly what the task says. Lowering a limit
    below the current usage stops nothing; the result warns, and the next growth is refused.

    Returns:
        ``{"changed", "owner", "quota" (limits or None), "usage", "warnings"?, "diff"?}``.

    Raises:
        TenancyError: bad owner or limit (option named), or the store cannot be used.
    """
    owner = params["owner"]
    problem = dns_label_problem("owner", owner, "the CloudVM spec.owner rule")
    if problem:
        raise TenancyError(problem)
    wanted: Optional[dict] = None
    if params.get("state", "present") == "present":
        wanted = {dim: params.get(dim) for dim in quota.LIMITS}
        errors = quota.validate_limits(wanted)
        if errors:
            raise TenancyError("; ".join(errors))
    cfg = _config(params.get("host_config"))
    try:
        if check_mode and not os.path.exists(cfg.store_path):
            before, usage = None, quota.zero()
        else:
            with HostStore(cfg.store_path, read_only=check_mode) as store:
                before = store.get_quota(owner)
                changed = before != wanted
                if changed and not check_mode:
                    with store.transaction():
                        store.put_quota(owner, wanted)
                        store.record_audit(params.get("actor") or "operator",
                                           "quota-set" if wanted is not None else "quota-remove", f"quota/{owner}",
                                           "succeeded", f"quota of {owner}: {_describe(before)} -> {_describe(wanted)}",
                                           owner=owner, operator=True, data={"before": before, "after": wanted})
                usage = store.owner_usage(owner)
    except StoreError as exc:
        raise TenancyError(f"host_config: {exc}") from exc
    out: dict = {"changed": before != wanted, "owner": owner, "quota": wanted, "usage": usage}
    over = [f"{dim}: owner {owner!r} already uses {usage[dim]} of the quota {wanted[dim]} {quota.UNITS[dim]};"
            " nothing is stopped, growth is refused until the usage is below the quota"
            for dim in quota.LIMITS if wanted and wanted[dim] is not None and usage[dim] > wanted[dim]]
    if over:
        out["warnings"] = over
    if diff:
        out["diff"] = {"before": before or {}, "after": wanted or {}}
    return out


def _describe(limits: Optional[dict]) -> str:
    if limits is None:
        return "none (unlimited)"
    return ", ".join(f"{dim}={'unlimited' if limits.get(dim) is None else limits[dim]}" for dim in quota.LIMITS)


def list_audit(params: dict) -> dict:
    """The audit records matching the filters (owner, actor, subject, since), newest ``limit``, oldest first.

    The store is opened read-only; a store that does not exist yet has no records.

    Raises:
        TenancyError: a bad ``since`` or ``limit`` (option named), or the store cannot be read.
    """
    since, limit = params.get("since"), params.get("limit")
    if since is not None and not _SINCE.match(since):
        raise TenancyError(f"since: {since!r} is not an RFC 3339 UTC time such as 2026-11-30T07:00:00Z"
                           " (or a date 2026-11-30)")
    if limit is None or limit < 1:
        raise TenancyError(f"limit: {limit!r} is not an integer >= 1")
    cfg = _config(params.get("host_config"))
    if not os.path.exists(cfg.store_path):
        return {"changed": False, "records": []}
    try:
        with HostStore(cfg.store_path, read_only=True) as store:
            records = store.audit(owner=params.get("owner"), actor=params.get("actor"), subject=params.get("subject"),
                                  since=since, limit=limit)
    except StoreError as exc:
        raise TenancyError(f"host_config: {exc}") from exc
    return {"changed": False, "records": records}
