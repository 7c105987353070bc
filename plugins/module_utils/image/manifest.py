# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image-set manifest (``manifest.json``): shape and construction.

Shape (contract, docs/guest-image.md)::

    {"apiVersion": "image.cloud.zjusct.io/v1", "kind": "ImageSet", "name", "version", "distro", "suite",
     "mirror", "packages": [...], "kernelVersion", "defaultCmdline",
     "artifacts": {"rootfs.raw": {"sha256", "size", "allocated"}, "vmlinuz": ..., "vmlinux": ..., "initrd.img": ...},
     "inputsSha256", "inputs": {canonical inputs}, "builtAt": RFC 3339 UTC}

``size`` is the apparent size in bytes, ``allocated`` the bytes actually allocated (sparse rootfs).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import (
    ARTIFACTS,
    MANIFEST_API_VERSION,
    MANIFEST_KIND,
    BuildInputs,
    sha256_file,
)

DEFAULT_CMDLINE = "console=ttyS0 root=/dev/vda rw net.ifnames=0 panic=-1 quiet zjusct.identity=/dev/vdb"


def artifact_facts(set_dir: str) -> dict[str, dict[str, Any]]:
    """sha256, apparent size and allocated bytes of every artefact in ``set_dir``.

    Raises:
        FileNotFoundError: an artefact is missing.
    """
    facts = {}
    for name in ARTIFACTS:
        path = os.path.join(set_dir, name)
        st = os.stat(path)
        facts[name] = {"sha256": sha256_file(path), "size": st.st_size, "allocated": st.st_blocks * 512}
    return facts


def build_manifest(
    inputs: BuildInputs,
    kernel_version: str,
    artifacts: dict[str, dict[str, Any]],
    cmdline: str = DEFAULT_CMDLINE,
    built_at: datetime | None = None,
) -> dict[str, Any]:
    """The manifest document for a finished set (pure)."""
    when = (built_at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    canonical = inputs.canonical()
    return {
        "apiVersion": MANIFEST_API_VERSION,
        "kind": MANIFEST_KIND,
        "name": inputs.name,
        "version": inputs.version,
        "distro": inputs.distro,
        "suite": inputs.suite,
        "mirror": canonical["mirror"],
        "packages": canonical["packages"],
        "kernelPackage": inputs.kernel_package,
        "kernelVersion": kernel_version,
        "defaultCmdline": cmdline,
        "artifacts": artifacts,
        "inputsSha256": inputs.sha256(),
        "inputs": canonical,
        "builtAt": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def dumps(manifest: dict[str, Any]) -> bytes:
    """Stable JSON bytes (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
