# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.root_volume_info``: a CloudVM's root volume in one shape on both backends (the host
store's record, :func:`host.volumes.root_volume_info`; the claim and its PersistentVolume,
:func:`k8s.root_volume.root_volume_info`), by the backend choice of :mod:`backend`."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.backend import backend_argument_spec, resolve_backend
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import is_dns_subdomain, vm_option_claim

ROOT_VOLUME_INFO_ONE_OF = [("name", "vm")]  # mutually exclusive and one of them required


def root_volume_info_argument_spec() -> dict:
    """The ``zjusct.cloud.root_volume_info`` module's argument spec: the backend options, ``name`` or ``vm``, and
    ``namespace``."""
    spec = backend_argument_spec()
    spec.update(name={"type": "str"}, vm={"type": "str"}, namespace={"type": "str", "default": "default"})
    return spec


def run_root_volume_info(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.root_volume_info`` module, read-only (the same in check mode). ``vm`` names the root
    volume a new CloudVM of that name gets (:func:`model.spec.vm_option_claim`, ``<vm>-root``).

    Returns:
        ``{changed: False, name, volume, missing, volume_driver, rbd_image, host_config}`` (the module's RETURN).

    Raises:
        CloudVMError: ``vm`` is not a DNS label or ``name`` not a DNS subdomain (option, value and rule named).
        CloudError: the host store or the API server cannot be read (named).
    """
    name = params.get("name")
    if params.get("vm") is not None:
        name, problem = vm_option_claim(params["vm"])
        if problem:
            raise CloudVMError(problem)
    if not is_dns_subdomain(name):
        raise CloudVMError(f"name: {name!r} is not a DNS subdomain (a volume or claim name such as web-root)")
    if resolve_backend(params) == "host":
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import root_volume_info
    else:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.root_volume import root_volume_info
    return dict(root_volume_info(dict(params, name=name)), name=name)
