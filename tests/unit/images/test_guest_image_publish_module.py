"""image/guest_image_publish_module.py: sealing a staged set and publishing it atomically (tmp files only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_publish_module import (
    PublishError,
    inputs_from_canonical,
    publish,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import ARTIFACTS, BuildInputs, check_manifest

BASE = BuildInputs(name="debian-bookworm", distro="debian", suite="bookworm", mirror="http://deb.debian.org/debian",
                   packages=("systemd", "dbus", "openssh-server"))


def _staging(tmp_path: Path) -> Path:
    out = tmp_path / ".build" / "out"
    out.mkdir(parents=True)
    for name in ARTIFACTS:
        (out / name).write_bytes(name.encode() * 10)
    return out


def test_publish_writes_manifest_last_and_set_is_complete(tmp_path: Path) -> None:
    out = _staging(tmp_path)
    final = tmp_path / BASE.set_name
    assert not check_manifest(str(out), BASE.sha256()).complete  # no manifest yet: not a set
    changed, manifest = publish(str(out), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x", "root=/dev/vda",
                                force=False)
    assert changed and not out.exists()
    check = check_manifest(str(final), BASE.sha256(), verify_sha256=True)
    assert check.complete, check.reason
    assert json.loads((final / "manifest.json").read_text()) == manifest
    assert all(not os.access(final / n, os.W_OK) or os.geteuid() == 0 for n in ARTIFACTS)
    assert (os.stat(final / "rootfs.raw").st_mode & 0o222) == 0
    # Same inputs again: nothing changes.
    assert publish(str(_staging(tmp_path / "again")), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x",
                   "root=/dev/vda", force=False)[0] is False


def test_truncated_artefact_makes_the_set_incomplete(tmp_path: Path) -> None:
    final = tmp_path / BASE.set_name
    publish(str(_staging(tmp_path)), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x", "x", force=False)
    os.chmod(final / "vmlinux", 0o644)
    (final / "vmlinux").write_bytes(b"short")
    assert "size" in check_manifest(str(final), BASE.sha256()).reason


def test_inputs_that_do_not_hash_to_the_plan_or_a_missing_artefact_are_refused(tmp_path: Path) -> None:
    out = _staging(tmp_path)
    with pytest.raises(PublishError, match=r"^inputs_sha256: "):
        publish(str(out), str(tmp_path / "set"), BASE.canonical(), "0" * 64, "6.1.0-x", "x", force=False)
    (out / "initrd.img").unlink()
    with pytest.raises(PublishError, match=r"lacks initrd\.img"):
        publish(str(out), str(tmp_path / "set"), BASE.canonical(), BASE.sha256(), "6.1.0-x", "x", force=False)


def test_canonical_inputs_round_trip_and_bad_ones_are_refused() -> None:
    assert inputs_from_canonical(BASE.canonical()).sha256() == BASE.sha256()
    with pytest.raises(PublishError, match=r"^inputs: not the canonical inputs"):
        inputs_from_canonical({"name": "x"})
