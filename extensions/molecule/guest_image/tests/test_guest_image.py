"""Verify of the Molecule scenario ``guest_image``: what roles/guest_image promises (README, docs/guest-image.md).

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``, the build host). The image
directory is the throwaway one of the scenario; exactly one complete set must be in it and no build leftovers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

IMAGES = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "images"
ARTIFACTS = ("rootfs.raw", "vmlinuz", "vmlinux", "initrd.img")


def image_set(host) -> tuple[Path, dict]:
    """The one set's directory and its manifest."""
    listing = host.run("ls -A %s", str(IMAGES))
    assert listing.rc == 0, listing.stderr
    entries = listing.stdout.split()
    assert len(entries) == 1 and entries[0].startswith("debian-bookworm-"), f"expected one set, no leftovers: {entries}"
    path = IMAGES / entries[0]
    return path, json.loads(host.file(str(path / "manifest.json")).content_string)


def test_manifest_names_the_set(host) -> None:
    path, manifest = image_set(host)
    assert manifest["apiVersion"] == "image.cloud.zjusct.io/v1"
    assert manifest["kind"] == "ImageSet"
    assert manifest["name"] == "debian-bookworm"
    assert path.name == f"debian-bookworm-{manifest['version']}"
    assert len(manifest["version"]) == 12
    assert manifest["inputsSha256"].startswith(manifest["version"])
    assert manifest["defaultCmdline"].startswith("console=ttyS0 root=/dev/vda")


def test_artifacts_match_manifest(host) -> None:
    path, manifest = image_set(host)
    for name in ARTIFACTS:
        f = host.file(str(path / name))
        assert f.is_file and f.mode == 0o444, name
        assert f.size == manifest["artifacts"][name]["size"], name
        assert f.sha256sum == manifest["artifacts"][name]["sha256"], name


def test_rootfs_is_ext4_labelled_root(host) -> None:
    path = image_set(host)[0]
    out = host.run("blkid -o export %s", str(path / "rootfs.raw"))
    assert out.rc == 0, out.stderr
    fields = dict(line.split("=", 1) for line in out.stdout.split())
    assert fields["TYPE"] == "ext4" and fields["LABEL"] == "root"


def test_rootfs_has_python_sshd_and_identity(host) -> None:
    """Inside the image (read with debugfs, no mount): Python for Ansible, sshd, the identity script and unit."""
    path = image_set(host)[0]
    for inside in ("/usr/bin/python3", "/usr/sbin/sshd", "/usr/local/sbin/zjusct-identity",
                   "/etc/systemd/system/zjusct-identity.service"):
        out = host.run("debugfs -R %s %s", f"stat {inside}", str(path / "rootfs.raw"))
        assert out.rc == 0 and "Inode:" in out.stdout, f"{inside}: {out.stdout}{out.stderr}"


def test_no_host_keys_in_image(host) -> None:
    """Each guest makes its own SSH host keys: the image ships none."""
    path = image_set(host)[0]
    out = host.run("debugfs -R %s %s", "ls -l /etc/ssh", str(path / "rootfs.raw"))
    assert out.rc == 0, out.stderr
    assert "ssh_host_" not in out.stdout, out.stdout


def test_initrd_is_gzip_cpio(host) -> None:
    path = image_set(host)[0]
    out = host.run("gzip -dc %s | cpio -t --quiet", str(path / "initrd.img"))
    assert out.rc == 0, out.stderr
    assert {"init", "bin/busybox"} <= set(out.stdout.split()), out.stdout
