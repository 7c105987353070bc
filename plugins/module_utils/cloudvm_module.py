# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs of the cloudvm modules (and of owner_quota, volume_backup and rbd_backup, which have both backends
too) and the dispatch to a backend.

Each backend module exposes ``ensure(params, check_mode, diff) -> dict`` (the module result:
``changed``, ``cloudvm``, ``phase``, ``boot_id``, optional ``diff``),
``info(params) -> list[dict]`` (CloudVM objects) and ``running_doubts(params, vms) -> dict`` (why a Running status
of ``vms`` is not backed by its launcher Pod, by ``"<namespace>/<name>"``), raising
:class:`~model.lifecycle.CloudVMError` for every refusal.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import auth_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import LIMITS
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import in_user_terms, is_dns_label

BACKENDS = ("host", "kubernetes")
# what a playbook may look a VM up for with cloudvm_info's authorize (the audit record's action)
AUTHORIZE_ACTIONS = ("start", "stop", "restart", "update", "delete", "backup", "restore")


def backend_argument_spec() -> dict:
    """Options shared by every cloudvm module: backend switch, host config, Kubernetes auth."""
    spec = {
        "backend": {"type": "str", "choices": list(BACKENDS)},
        "host_config": {"type": "path"},
    }
    spec.update(auth_argument_spec())  # empty when kubernetes.core is missing: only the host backend works
    return spec


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


def resolve_backend(params: dict) -> str:
    """The backend named by the options, else ``ZJUSCT_CLOUD_BACKEND``, else ``host``."""
    backend = params.get("backend") or os.environ.get("ZJUSCT_CLOUD_BACKEND") or "host"
    if backend not in BACKENDS:
        raise CloudVMError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    return backend


def _impl(backend: str) -> Any:
    if backend == "host":
        from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as impl
    else:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import cloudvm as impl
    return impl


def check_identity(params: dict) -> None:
    """Check ``name`` and ``namespace`` before any backend is asked (RFC 1123 DNS labels).

    Raises:
        CloudVMError: every problem in one message, naming the option, the API field, the value and the rule.
    """
    errors = [f"metadata.{field}: {params.get(field)!r} is not a DNS label"
              for field in ("name", "namespace") if not is_dns_label(params.get(field))]
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
        impl = _impl(resolve_backend(params))
        return impl.ensure(params, check_mode=check_mode, diff=diff)
    except CloudError as exc:
        raise CloudVMError(in_user_terms(str(exc)), **exc.failure()) from exc


def run_cloudvm_info(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.cloudvm_info`` module: the backend's ``info`` (the same in check mode), then, with
    ``authorize``, the backend's ``authorize_found`` over what was found; ``running_doubts`` is the backend's
    ``running_doubts`` of what was found (``{"<namespace>/<name>": why}`` of the VMs whose status says Running while
    their launcher Pod does not back it, Kubernetes only; the statuses are returned unchanged).

    Raises:
        CloudVMError: the backend could not list, or (``authorize``) a CloudVM found belongs to another owner
            (``reason: Forbidden``, recorded by the backend: the host's audit trail, the API server's audit log).
    """
    impl = _impl(resolve_backend(params))
    found = impl.info(params)
    if params.get("authorize"):
        try:
            impl.authorize_found(params, found)
        except CloudError as exc:
            raise CloudVMError(in_user_terms(str(exc)), **exc.failure()) from exc
    return {"changed": False, "cloudvms": found, "running_doubts": impl.running_doubts(params, found)}


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
    """The ``zjusct.cloud.owner_quota`` module: the host store's quota row (``host.tenancy_module.set_quota``) or the
    owner's CloudQuota (``k8s.quota.run_owner_quota``), by :func:`resolve_backend`.

    Raises:
        CloudError: bad input (option named) or a refusal of the store or the API server.
    """
    if resolve_backend(params) == "host":
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.tenancy_module import set_quota

        return set_quota(params, check_mode, diff)
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.quota import run_owner_quota as k8s_quota

    return k8s_quota(params, check_mode, diff)


def volume_backup_argument_spec() -> dict:
    """The ``zjusct.cloud.volume_backup`` module's argument spec: the host body's options
    (``host.volume_backup_module.volume_backup_argument_spec``) and ``event`` with kubernetes.core's connection
    options (``k8s.backup_events.event_argument_spec``)."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_backup_module import (
        volume_backup_argument_spec as host_spec,
    )
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.backup_events import event_argument_spec

    return dict(host_spec(), **event_argument_spec())


def run_volume_backup(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.volume_backup`` module: the backup, verification or restore
    (``host.volume_backup_module.run_volume_backup``, audited in a host store with ``host_config``), recorded as an
    Event of a CloudVM with ``event`` (``k8s.backup_events.run_with_events``, the Kubernetes backend)."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_backup_module import (
        run_volume_backup as host_run,
    )
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.backup_events import run_with_events

    return run_with_events(params, lambda: host_run(params, check_mode), check_mode)


def run_rbd_backup(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.rbd_backup`` module: ``host.volume_backup_module.run_rbd_backup``, recorded as an Event of
    a CloudVM with ``event`` as :func:`run_volume_backup`."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_backup_module import run_rbd_backup as host
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.backup_events import run_with_events

    return run_with_events(params, lambda: host(params, check_mode), check_mode)
