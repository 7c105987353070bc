"""image/manifest.py: the manifest document of a finished image set, its artefact facts and its bytes."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import (
    ARTIFACTS,
    MANIFEST_API_VERSION,
    MANIFEST_KIND,
    BuildInputs,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.manifest import (
    DEFAULT_CMDLINE,
    artifact_facts,
    build_manifest,
    dumps,
)

INPUTS = BuildInputs(name="debian-bookworm", distro="debian", suite="bookworm",
                     mirror="http://deb.debian.org/debian/", packages=("systemd", "dbus", "dbus"))


def test_the_manifest_names_the_set_its_inputs_and_artefacts() -> None:
    when = datetime(2026, 1, 2, 4, 5, 6, tzinfo=timezone(timedelta(hours=8)))
    facts = {"vmlinux": {"sha256": "ab", "size": 3, "allocated": 4096}}
    manifest = build_manifest(INPUTS, "6.1.0-x", facts, built_at=when)
    assert manifest["apiVersion"] == MANIFEST_API_VERSION and manifest["kind"] == MANIFEST_KIND
    assert (manifest["name"], manifest["version"]) == ("debian-bookworm", INPUTS.version)
    assert manifest["mirror"] == "http://deb.debian.org/debian", "canonical: no trailing slash"
    assert manifest["packages"] == ["dbus", "systemd"]
    assert manifest["inputsSha256"] == INPUTS.sha256() and manifest["inputs"] == INPUTS.canonical()
    assert manifest["kernelVersion"] == "6.1.0-x" and manifest["defaultCmdline"] == DEFAULT_CMDLINE
    assert manifest["artifacts"] == facts
    assert manifest["builtAt"] == "2026-01-01T20:05:06Z", "RFC 3339 in UTC"


def test_artifact_facts_hash_and_size_every_artefact(tmp_path: Path) -> None:
    for name in ARTIFACTS:
        (tmp_path / name).write_bytes(name.encode())
    facts = artifact_facts(str(tmp_path))
    assert set(facts) == set(ARTIFACTS)
    assert facts["vmlinux"]["sha256"] == hashlib.sha256(b"vmlinux").hexdigest()
    assert facts["vmlinux"]["size"] == len(b"vmlinux") and facts["vmlinux"]["allocated"] % 512 == 0
    (tmp_path / "initrd.img").unlink()
    with pytest.raises(FileNotFoundError):
        artifact_facts(str(tmp_path))


def test_dumps_is_stable_json_with_a_trailing_newline() -> None:
    manifest = build_manifest(INPUTS, "6.1.0-x", {}, built_at=datetime(2026, 1, 1, tzinfo=UTC))
    blob = dumps(manifest)
    assert blob.endswith(b"}\n") and json.loads(blob) == manifest
    assert blob == dumps(dict(reversed(list(manifest.items())))), "key order does not matter"
