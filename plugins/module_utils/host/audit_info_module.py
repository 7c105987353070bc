# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.audit_info``: the host store's audit trail (:func:`host.tenancy.list_audit`)."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.host.tenancy import list_audit


def run_audit_info(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.audit_info`` module: :func:`host.tenancy.list_audit` (read-only, the same in check
    mode).

    Returns:
        ``{"changed": False, "records": [...]}``, the records oldest first.

    Raises:
        TenancyError: a bad ``since`` or ``limit`` (option named), or the store cannot be read.
    """
    return list_audit(params)
