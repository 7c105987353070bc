# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.guest_image_plan``: the versioned name of a guest image set's build inputs and
whether a complete set of them exists (:mod:`image.inputs`)."""

from __future__ import annotations

import os

from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import BuildInputs, check_manifest


def run_guest_image_plan(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.guest_image_plan`` module: the versioned name of the inputs and whether ``dir``
    already holds a complete image set of them (read-only, the same in check mode).

    Returns:
        ``changed`` (always False), ``version``, ``inputs_sha256``, ``set_name``, ``path``, ``build_path``,
        ``complete``, ``reason``, ``inputs`` (canonical), ``manifest``.

    Raises:
        InputError: an invalid input, naming the option (:meth:`BuildInputs.validate`).
    """
    inputs = BuildInputs(
        name=params["name"], distro=params["distro"], suite=params["suite"], mirror=params["mirror"],
        components=tuple(params["components"]), packages=tuple(params["packages"]), size_mib=params["size_mib"],
        kernel_package=params["kernel_package"], prune_module_dirs=tuple(params["prune_module_dirs"]),
        extra={str(k): str(v) for k, v in params["extra_inputs"].items()},
    )
    inputs.validate()
    path = os.path.join(params["dir"], inputs.set_name)
    check = check_manifest(path, inputs.sha256(), verify_sha256=params["verify_sha256"])
    return {
        "changed": False, "version": inputs.version, "inputs_sha256": inputs.sha256(), "set_name": inputs.set_name,
        "path": path, "build_path": os.path.join(params["dir"], f".build-{inputs.set_name}"),
        "complete": check.complete, "reason": check.reason, "inputs": inputs.canonical(), "manifest": check.manifest,
    }
