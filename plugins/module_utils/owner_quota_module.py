# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.owner_quota`` (:func:`run_owner_quota`) and its argument spec: an owner's quota in
the host store (``host.tenancy``) or the owner's CloudQuota (``k8s.quota``), by the backend choice (:mod:`backend`).
"""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.backend import backend_argument_spec, resolve_backend
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import LIMITS


def owner_quota_argument_spec() -> dict:
    """The ``zjusct.cloud.owner_quota`` module's argument spec: the backend options and the limits."""
    spec = backend_argument_spec()
    spec.update(
        owner={"type": "str", "required": True},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        actor={"type": "str", "default": "operator"},
        **{dim: {"type": "int"} for dim in LIMITS},  # the quota dimensions (docs/security.md, "Quotas")
    )
    return spec


def run_owner_quota(params: dict, check_mode: bool, diff: bool) -> dict:
    """The ``zjusct.cloud.owner_quota`` module: the host store's quota row (``host.tenancy.set_quota``) or the
    owner's CloudQuota (``k8s.quota.ensure_quota``), by :func:`backend.resolve_backend`.

    Raises:
        CloudError: bad input (option named) or a refusal of the store or the API server.
    """
    if resolve_backend(params) == "host":
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.tenancy import set_quota

        return set_quota(params, check_mode, diff)
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.quota import ensure_quota

    return ensure_quota(params, check_mode, diff)
