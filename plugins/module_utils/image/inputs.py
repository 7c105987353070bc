# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Canonical build inputs of a guest image set, its version, and whether a complete set already exists.

The image-set contract (docs/guest-image.md): ``<images_dir>/<name>-<version>/`` where ``version`` is the first
12 hex digits of the sha256 of the canonical JSON of the build inputs. ``manifest.json`` is written last, so a
directory whose manifest is present, parses, carries the same ``inputsSha256`` and lists artefacts that exist
with the recorded sizes is a complete image set.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

# Bump when the build logic that is not a role file (initrd layout, vmlinux extraction, manifest shape)
# changes in a way that changes the artefacts.
BUILDER_VERSION = "1"
MANIFEST_API_VERSION = "image.cloud.zjusct.io/v1"
MANIFEST_KIND = "ImageSet"
MANIFEST_FILE = "manifest.json"
ARTIFACTS = ("rootfs.raw", "vmlinuz", "vmlinux", "initrd.img")
DISTROS = ("debian", "ubuntu")
SIZE_MIB_MIN = 512
SIZE_MIB_MAX = 65536
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]{1,31}$")
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]*$")


class InputError(CloudError, ValueError):
    """An input is out of range; the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class BuildInputs:
    """Everything that determines the artefacts of an image set.

    Attributes:
        name: image name without version, e.g. ``debian-bookworm`` (lowercase DNS label characters, <= 63).
        distro: ``debian`` or ``ubuntu``.
        suite: release code name (``bookworm``, ``noble``).
        mirror: archive URL given to debootstrap (``http://deb.debian.org/debian``).
        components: archive components (``main`` for Debian; ``main,universe`` style for Ubuntu).
        packages: packages added to the minbase variant (order and duplicates do not matter).
        size_mib: size of ``rootfs.raw`` in MiB, 512-65536.
        kernel_package: package providing the guest kernel inside the image.
        prune_module_dirs: directories under ``/lib/modules/<ver>/kernel`` dropped from the image.
        extra: other inputs (sha256 of the in-guest scripts and units) as a flat str->str mapping.
    """

    name: str
    distro: str
    suite: str
    mirror: str
    components: tuple[str, ...] = ("main",)
    packages: tuple[str, ...] = ()
    size_mib: int = 2048
    kernel_package: str = "linux-image-amd64"
    prune_module_dirs: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise InputError naming the first bad field."""
        if not _NAME_RE.match(self.name):
            raise InputError(f"name: {self.name!r} must match {_NAME_RE.pattern}")
        if self.distro not in DISTROS:
            raise InputError(f"distro: {self.distro!r} is not one of {', '.join(DISTROS)}")
        if not _SUITE_RE.match(self.suite):
            raise InputError(f"suite: {self.suite!r} must match {_SUITE_RE.pattern}")
        if not re.match(r"^(https?|file)://\S+$", self.mirror):
            raise InputError(f"mirror: {self.mirror!r} must be an http(s):// or file:// URL")
        if not self.components:
            raise InputError("components: must list at least one archive component")
        for i, pkg in enumerate((*self.packages, self.kernel_package)):
            if not _PACKAGE_RE.match(pkg):
                raise InputError(f"packages[{i}]: {pkg!r} is not a Debian package name")
        if not SIZE_MIB_MIN <= self.size_mib <= SIZE_MIB_MAX:
            raise InputError(f"size_mib: {self.size_mib} is outside {SIZE_MIB_MIN}-{SIZE_MIB_MAX}")
        for i, d in enumerate(self.prune_module_dirs):
            if d.startswith("/") or ".." in d.split("/") or not d:
                raise InputError(f"prune_module_dirs[{i}]: {d!r} must be a relative path without '..'")

    def canonical(self) -> dict[str, Any]:
        """The inputs as plain JSON data in canonical form (sorted, de-duplicated lists)."""
        return {
            "builder": BUILDER_VERSION,
            "name": self.name,
            "distro": self.distro,
            "suite": self.suite,
            "mirror": self.mirror.rstrip("/"),
            "components": list(self.components),
            "packages": sorted(set(self.packages)),
            "kernelPackage": self.kernel_package,
            "sizeMiB": self.size_mib,
            "pruneModuleDirs": sorted(set(self.prune_module_dirs)),
            "extra": {k: self.extra[k] for k in sorted(self.extra)},
        }

    def sha256(self) -> str:
        """sha256 (hex) of the canonical JSON (sorted keys, no whitespace)."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def version(self) -> str:
        """First 12 hex digits of :meth:`sha256`."""
        return self.sha256()[:12]

    @property
    def set_name(self) -> str:
        """Directory name of the image set: ``<name>-<version>``."""
        return f"{self.name}-{self.version}"


@dataclass(frozen=True)
class ManifestCheck:
    """Whether ``<dir>/manifest.json`` describes a complete image set for the given inputs."""

    complete: bool
    reason: str
    manifest: dict[str, Any] | None = None


def check_manifest(set_dir: str, inputs_sha256: str, verify_sha256: bool = False) -> ManifestCheck:
    """Inspect an image-set directory.

    Args:
        set_dir: the ``<images_dir>/<name>-<version>`` directory.
        inputs_sha256: the expected ``inputsSha256``.
        verify_sha256: also re-hash every artefact (reads the whole rootfs; seconds per GiB).

    Returns:
        ManifestCheck with complete=True only if the manifest parses, matches the inputs and every artefact
        exists with the recorded size (and sha256 when asked); otherwise ``reason`` says what is wrong.
    """
    path = os.path.join(set_dir, MANIFEST_FILE)
    if not os.path.isdir(set_dir):
        return ManifestCheck(False, f"{set_dir} does not exist")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        return ManifestCheck(False, f"{path} is missing (an incomplete or interrupted build)")
    except (OSError, ValueError) as exc:
        return ManifestCheck(False, f"{path} is unreadable: {exc}")
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        return ManifestCheck(False, f"{path}: kind is not {MANIFEST_KIND}")
    if manifest.get("inputsSha256") != inputs_sha256:
        return ManifestCheck(False, f"{path}: inputsSha256 {manifest.get('inputsSha256')!r} != {inputs_sha256}")
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict):
        return ManifestCheck(False, f"{path}: artifacts is not a mapping")
    for name in ARTIFACTS:
        entry = artifacts.get(name)
        if not isinstance(entry, dict):
            return ManifestCheck(False, f"{path}: artifacts.{name} is missing")
        file_path = os.path.join(set_dir, name)
        try:
            size = os.stat(file_path).st_size
        except OSError:
            return ManifestCheck(False, f"{file_path} is missing")
        if size != entry.get("size"):
            return ManifestCheck(False, f"{file_path}: size {size} != manifest {entry.get('size')}")
        if verify_sha256 and sha256_file(file_path) != entry.get("sha256"):
            return ManifestCheck(False, f"{file_path}: sha256 differs from the manifest")
    return ManifestCheck(True, "complete", manifest)


def sha256_file(path: str, chunk: int = 4 << 20) -> str:
    """sha256 (hex) of a file's content, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()
