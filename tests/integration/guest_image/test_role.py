"""The role run against the real cache: idempotence and the manifest's promises (no guest boot)."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import ARTIFACTS, sha256_file

from tests.guest_image_fixture import GuestImage, ensure_image_set

pytestmark = [pytest.mark.guest, pytest.mark.timeout(3600)]


def test_second_role_run_changes_nothing(guest_image: GuestImage) -> None:
    image, proc = ensure_image_set()
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", proc.stdout)
    assert recap is not None, proc.stdout[-2000:]
    assert recap.group(1) == "0"
    assert image.dir == guest_image.dir
    assert json.loads((image.dir / "manifest.json").read_text())["builtAt"] == guest_image.manifest["builtAt"]


def test_manifest_sha256s_match_the_files(guest_image: GuestImage) -> None:
    artifacts = guest_image.manifest["artifacts"]
    assert sorted(artifacts) == sorted(ARTIFACTS)
    for name in ARTIFACTS:
        path = guest_image.dir / name
        assert sha256_file(str(path)) == artifacts[name]["sha256"], name
        assert path.stat().st_size == artifacts[name]["size"], name


def test_manifest_names_the_contract_fields(guest_image: GuestImage) -> None:
    m = guest_image.manifest
    assert m["apiVersion"] == "image.cloud.zjusct.io/v1"
    assert m["kind"] == "ImageSet"
    assert guest_image.dir.name == f"{m['name']}-{m['version']}"
    assert m["inputsSha256"].startswith(m["version"])
    assert "root=/dev/vda" in m["defaultCmdline"] and "zjusct.identity=/dev/vdb" in m["defaultCmdline"]
    assert guest_image.vmlinux.read_bytes()[:4] == b"\x7fELF"
    assert guest_image.vmlinuz.read_bytes()[0x202:0x206] == b"HdrS"


def test_image_set_is_read_only_and_rootfs_sparse(guest_image: GuestImage) -> None:
    for name in (*ARTIFACTS, "manifest.json"):
        mode = stat.S_IMODE(os.stat(guest_image.dir / name).st_mode)
        assert mode & 0o222 == 0, f"{name} is writable ({oct(mode)})"
    st = guest_image.rootfs.stat()
    assert st.st_blocks * 512 < st.st_size
    assert st.st_size == guest_image.manifest["inputs"]["sizeMiB"] * 1024 * 1024
