# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backend choice of the modules with both backends (``cloudvm``, ``cloudvm_info``, ``owner_quota``) and the
dispatch to a backend's CloudVM entry points; shared by their bodies (``cloudvm_module``, ``cloudvm_info_module``,
``owner_quota_module``).

The choice (docs/architecture.md, "The backend choice"): the module option ``backend``, else the environment
variable :data:`BACKEND_ENV`, else :data:`DEFAULT_BACKEND`. The inventory plugin's ``source`` names the same two
backends with a default of its own (``kubernetes``); the page says why the two defaults differ.

Each backend's CloudVM entry points (:func:`cloudvm_backend`: ``host.cloudvm`` or ``k8s.cloudvm``) are
``ensure(params, check_mode, diff) -> dict`` (the module result: ``changed``, ``cloudvm``, ``phase``,
``boot_id``, optional ``diff``), ``info(params) -> list[dict]`` (CloudVM objects),
``authorize_found(params, vms)`` and ``running_doubts(params, vms) -> dict`` (why a Running status of ``vms`` is
not backed by its launcher Pod, by ``"<namespace>/<name>"``), raising a :class:`common.errors.CloudError` for
every refusal and failure.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import auth_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import in_user_terms

BACKENDS = ("host", "kubernetes")
DEFAULT_BACKEND = "host"
BACKEND_ENV = "ZJUSCT_CLOUD_BACKEND"


def backend_argument_spec() -> dict:
    """Options shared by every module with both backends: backend switch, host config, Kubernetes auth."""
    spec = {
        "backend": {"type": "str", "choices": list(BACKENDS)},
        "host_config": {"type": "path"},
    }
    spec.update(auth_argument_spec())  # empty when kubernetes.core is missing: only the host backend works
    return spec


def resolve_backend(params: dict) -> str:
    """The backend named by the option ``backend``, else :data:`BACKEND_ENV` (``ZJUSCT_CLOUD_BACKEND``), else
    :data:`DEFAULT_BACKEND` (``host``).

    Raises:
        CloudVMError: the name is not one of :data:`BACKENDS`.
    """
    backend = params.get("backend") or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
    if backend not in BACKENDS:
        raise CloudVMError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    return backend


def cloudvm_backend(backend: str) -> Any:
    """The CloudVM entry points of ``backend`` (module docstring): the module ``host.cloudvm`` or ``k8s.cloudvm``,
    imported only when chosen."""
    if backend == "host":
        from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as impl
    else:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import cloudvm as impl
    return impl


def in_user_terms_error(exc: CloudError) -> CloudVMError:
    """``exc`` (any room's refusal or failure) as the CloudVMError a cloudvm module reports: its message through
    :func:`model.spec.in_user_terms` (the option / playbook variable typed, the API field, the value and the rule),
    its failure keys (``details``, ``field``) kept."""
    return CloudVMError(in_user_terms(str(exc)), **exc.failure())
