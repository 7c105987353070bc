# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.cloudvm_info`` (:func:`run_cloudvm_info`) and its argument spec: the backend's
``info``, ``authorize_found`` and ``running_doubts`` (:mod:`backend`: the choice and the entry points).
"""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.backend import (
    backend_argument_spec,
    cloudvm_backend,
    in_user_terms_error,
    resolve_backend,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

# what a playbook may look a VM up for with cloudvm_info's authorize (the audit record's action)
AUTHORIZE_ACTIONS = ("start", "stop", "restart", "update", "delete", "backup", "restore")


def cloudvm_info_argument_spec() -> dict:
    """The ``zjusct.cloud.cloudvm_info`` module's argument spec."""
    spec = backend_argument_spec()
    spec.update(
        name={"type": "str"},
        namespace={"type": "str"},
        owner={"type": "str"},
        label_selectors={"type": "list", "elements": "str", "default": []},
        authorize={"type": "dict", "options": {
            "owner": {"type": "str", "required": True},
            "operator": {"type": "bool", "default": False},
            "action": {"type": "str", "required": True, "choices": list(AUTHORIZE_ACTIONS)},
        }},
    )
    return spec


def run_cloudvm_info(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.cloudvm_info`` module: the backend's ``info`` (the same in check mode), then, with
    ``authorize``, the backend's ``authorize_found`` over what was found; ``running_doubts`` is the backend's
    ``running_doubts`` of what was found (``{"<namespace>/<name>": why}`` of the VMs whose status says Running while
    their launcher Pod does not back it, Kubernetes only; the statuses are returned unchanged).

    Raises:
        CloudVMError: the backend could not list, or (``authorize``) a CloudVM found belongs to another owner
            (``reason: Forbidden``, recorded by the backend: the host's audit trail, the API server's audit log).
    """
    impl = cloudvm_backend(resolve_backend(params))
    found = impl.info(params)
    if params.get("authorize"):
        try:
            impl.authorize_found(params, found)
        except CloudError as exc:
            raise in_user_terms_error(exc) from exc
    return {"changed": False, "cloudvms": found, "running_doubts": impl.running_doubts(params, found)}
