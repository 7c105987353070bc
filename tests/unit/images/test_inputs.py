"""image/inputs.py: the build inputs, their version, and whether a directory holds a complete image set."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import (
    ARTIFACTS,
    MANIFEST_FILE,
    MANIFEST_KIND,
    BuildInputs,
    InputError,
    check_manifest,
    sha256_file,
)

BASE = BuildInputs(name="debian-bookworm", distro="debian", suite="bookworm", mirror="http://deb.debian.org/debian",
                   packages=("systemd", "dbus", "openssh-server"))


def test_version_ignores_package_order_and_duplicates() -> None:
    same = BuildInputs(**{**BASE.__dict__, "packages": ("openssh-server", "dbus", "systemd", "dbus")})
    assert same.version == BASE.version
    assert len(BASE.version) == 12
    assert BASE.set_name == f"debian-bookworm-{BASE.version}"


@pytest.mark.parametrize("change", [{"mirror": "http://mirror.example/debian"}, {"size_mib": 4096},
                                    {"packages": ("systemd",)}, {"suite": "trixie"}, {"extra": {"init": "x"}}])
def test_every_input_changes_the_version(change: dict) -> None:
    assert BuildInputs(**{**BASE.__dict__, **change}).version != BASE.version


def test_a_trailing_slash_of_the_mirror_is_the_same_input() -> None:
    assert BuildInputs(**{**BASE.__dict__, "mirror": "http://deb.debian.org/debian/"}).version == BASE.version


@pytest.mark.parametrize(("change", "field"), [({"size_mib": 100}, "size_mib: 100 is outside 512-65536"),
                                               ({"distro": "arch"}, "distro: 'arch'"),
                                               ({"packages": ("Bad Name",)}, "packages[0]"),
                                               ({"mirror": "ftp:/x"}, "mirror:"),
                                               ({"prune_module_dirs": ("../x",)}, "prune_module_dirs[0]")])
def test_bad_inputs_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        BuildInputs(**{**BASE.__dict__, **change}).validate()


def _set(tmp_path: Path, **manifest_over: object) -> Path:
    """An image-set directory with every artefact and a manifest that describes them."""
    set_dir = tmp_path / BASE.set_name
    set_dir.mkdir()
    artifacts = {}
    for name in ARTIFACTS:
        data = name.encode() * 3
        (set_dir / name).write_bytes(data)
        artifacts[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest = {"kind": MANIFEST_KIND, "inputsSha256": BASE.sha256(), "artifacts": artifacts, **manifest_over}
    (set_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    return set_dir


def test_a_complete_set_is_complete_and_returns_its_manifest(tmp_path: Path) -> None:
    check = check_manifest(str(_set(tmp_path)), BASE.sha256(), verify_sha256=True)
    assert check.complete and check.reason == "complete"
    assert check.manifest is not None and check.manifest["inputsSha256"] == BASE.sha256()


@pytest.mark.parametrize(("over", "reason"), [
    ({"kind": "Other"}, f"kind is not {MANIFEST_KIND}"),
    ({"inputsSha256": "0" * 64}, "inputsSha256 '" + "0" * 64 + "' != "),
    ({"artifacts": []}, "artifacts is not a mapping"),
    ({"artifacts": {}}, "artifacts.rootfs.raw is missing"),
])
def test_a_manifest_that_does_not_describe_the_inputs_is_incomplete(tmp_path: Path, over: dict, reason: str) -> None:
    check = check_manifest(str(_set(tmp_path, **over)), BASE.sha256())
    assert not check.complete and reason in check.reason


def test_missing_directory_manifest_or_artefact_is_named(tmp_path: Path) -> None:
    assert check_manifest(str(tmp_path / "absent"), BASE.sha256()).reason.endswith("absent does not exist")
    set_dir = _set(tmp_path)
    (set_dir / "vmlinux").unlink()
    assert check_manifest(str(set_dir), BASE.sha256()).reason == f"{set_dir / 'vmlinux'} is missing"
    (set_dir / MANIFEST_FILE).write_text("{not json")
    assert "is unreadable" in check_manifest(str(set_dir), BASE.sha256()).reason
    (set_dir / MANIFEST_FILE).unlink()
    assert "is missing (an incomplete or interrupted build)" in check_manifest(str(set_dir), BASE.sha256()).reason


def test_size_is_always_checked_and_content_only_when_asked(tmp_path: Path) -> None:
    set_dir = _set(tmp_path)
    data = (set_dir / "initrd.img").read_bytes()
    (set_dir / "initrd.img").write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, other content
    assert check_manifest(str(set_dir), BASE.sha256()).complete
    assert check_manifest(str(set_dir), BASE.sha256(), verify_sha256=True).reason.endswith(
        "sha256 differs from the manifest")
    (set_dir / "initrd.img").write_bytes(b"short")
    assert "size 5 != manifest" in check_manifest(str(set_dir), BASE.sha256()).reason


def test_sha256_file_reads_in_chunks(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert sha256_file(str(tmp_path / "f"), chunk=3) == hashlib.sha256(b"x" * 10).hexdigest()
