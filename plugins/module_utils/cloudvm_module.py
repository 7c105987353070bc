# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.cloudvm`` (:func:`run_cloudvm`) and its argument spec: the identity checked, then the
backend's ``ensure`` (:mod:`backend`: the choice and the entry points).
"""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.backend import (
    backend_argument_spec,
    cloudvm_backend,
    in_user_terms_error,
    resolve_backend,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem


def cloudvm_argument_spec() -> dict:
    """The ``zjusct.cloud.cloudvm`` module's argument spec."""
    spec = backend_argument_spec()
    spec.update(
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        name={"type": "str", "required": True},
        namespace={"type": "str", "default": "default"},
        owner={"type": "str"},
        operator={"type": "bool", "default": False},
        root_volume_claim={"type": "str"},
        vcpus={"type": "int"},
        memory_mib={"type": "int"},
        power_state={"type": "str", "choices": ["running", "stopped"]},
        restart={"type": "bool", "default": False},
        ssh_authorized_keys={"type": "list", "elements": "str", "no_log": False},
        bandwidth={"type": "dict", "options": {
            "guaranteed_mbps": {"type": "int", "default": 0},
            "ceil_mbps": {"type": "int"},
            "pool": {"type": "str"},
            "priority": {"type": "int", "default": 0},
        }},
        disk_io={"type": "dict", "options": {
            "read_bytes_per_second": {"type": "int"},
            "write_bytes_per_second": {"type": "int"},
            "read_iops": {"type": "int"},
            "write_iops": {"type": "int"},
        }},
        labels={"type": "dict"},
        node_selector={"type": "dict"},
        anti_affinity_group={"type": "str"},
        image={"type": "str"},
        volume_size_mib={"type": "int"},
        delete_volume={"type": "bool", "default": False},
        wait={"type": "bool", "default": True},
        wait_timeout={"type": "int", "default": 600},
    )
    return spec


def check_identity(params: dict) -> None:
    """Check ``name`` and ``namespace`` before any backend is asked (RFC 1123 DNS labels).

    Raises:
        CloudVMError: every problem in one message, naming the option, the API field, the value and the rule.
    """
    errors = [problem for problem in (dns_label_problem(f"metadata.{field}", params.get(field))
                                      for field in ("name", "namespace")) if problem]
    if errors:
        raise CloudVMError("; ".join(errors), errors=errors)


def run_cloudvm(params: dict, check_mode: bool, diff: bool) -> dict:
    """The ``zjusct.cloud.cloudvm`` module: check the identity, dispatch to the backend's ``ensure``.

    Every refusal and failure (a :class:`common.errors.CloudError` of any room: the lifecycle's, the store's, a
    volume driver's ...) has its message go through :func:`model.spec.in_user_terms`, so it names the option /
    playbook variable typed, the API field, the value and the rule, on every backend.

    Raises:
        CloudVMError: the refusal, its message in user terms, its failure keys (``details``, ``field``) kept.
    """
    try:
        check_identity(params)
        impl = cloudvm_backend(resolve_backend(params))
        return impl.ensure(params, check_mode=check_mode, diff=diff)
    except CloudError as exc:
        raise in_user_terms_error(exc) from exc
