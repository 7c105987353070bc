# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.guest_image_publish``: seal and publish a built image set (manifest last, read-only
artefacts, one rename into place)."""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import fsync_dir, publish_dir, write_atomic
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import (
    ARTIFACTS,
    MANIFEST_FILE,
    BuildInputs,
    check_manifest,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.manifest import artifact_facts, build_manifest, dumps


class PublishError(CloudError, ValueError):
    """The staging directory or the inputs do not allow publishing."""


def inputs_from_canonical(canonical: dict[str, Any]) -> BuildInputs:
    """Rebuild BuildInputs from :meth:`BuildInputs.canonical` output."""
    try:
        return BuildInputs(
            name=canonical["name"], distro=canonical["distro"], suite=canonical["suite"],
            mirror=canonical["mirror"], components=tuple(canonical["components"]),
            packages=tuple(canonical["packages"]), size_mib=int(canonical["sizeMiB"]),
            kernel_package=canonical["kernelPackage"], prune_module_dirs=tuple(canonical["pruneModuleDirs"]),
            extra=dict(canonical["extra"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PublishError(f"inputs: not the canonical inputs of guest_image_plan ({exc})") from exc


def publish(
    staging: str, final: str, canonical: dict[str, Any], inputs_sha256: str, kernel_version: str,
    cmdline: str, force: bool,
) -> tuple[bool, dict[str, Any]]:
    """Publish ``staging`` as ``final``. Returns ``(changed, manifest)``.

    Raises:
        PublishError: inputs do not hash to ``inputs_sha256``, an artefact is missing, or the directories are on
            different filesystems.
    """
    inputs = inputs_from_canonical(canonical)
    if inputs.sha256() != inputs_sha256:
        raise PublishError(f"inputs_sha256: {inputs_sha256} does not match the inputs ({inputs.sha256()})")
    existing = check_manifest(final, inputs_sha256)
    if existing.complete and not force:
        return False, existing.manifest or {}
    missing = [a for a in ARTIFACTS if not os.path.isfile(os.path.join(staging, a))]
    if missing:
        raise PublishError(f"staging: {staging} lacks {', '.join(missing)}")
    parent = os.path.dirname(final.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    if os.stat(staging).st_dev != os.stat(parent).st_dev:
        raise PublishError(f"staging: {staging} is not on the filesystem of {parent}; a rename cannot be atomic")
    for name in ARTIFACTS:
        path = os.path.join(staging, name)
        os.chmod(path, 0o444)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    manifest = build_manifest(inputs, kernel_version, artifact_facts(staging), cmdline)
    write_atomic(os.path.join(staging, MANIFEST_FILE), dumps(manifest), 0o444)
    os.chmod(staging, 0o555)  # noqa: S103 - image sets are world-readable and immutable
    fsync_dir(staging)
    publish_dir(staging, final)
    return True, manifest


def run_guest_image_publish(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.guest_image_publish`` module (no check mode): :func:`publish` of the options.

    Returns:
        ``{"changed", "manifest", "path"}``.

    Raises:
        PublishError: as :func:`publish`.
    """
    changed, manifest = publish(params["staging"], params["path"], params["inputs"], params["inputs_sha256"],
                                params["kernel_version"], params["default_cmdline"], params["force"])
    return {"changed": changed, "manifest": manifest, "path": params["path"]}
