"""Session fixture ``guest_image``: the default guest image set, built by the real role if missing.

Runs ``ansible-playbook playbooks/guest_image.yml -e guest_image_dir=${ZJUSCT_CACHE}/images`` from the repository
root under an exclusive flock (concurrent sessions must not build the same set twice at once). A warm run only
checks the manifest. Also provides :func:`config_disk`, the per-VM identity archive of the guest contract.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
IMAGES_DIR = CACHE / "images"
BUILD_TIMEOUT_S = 3600


@dataclass(frozen=True)
class GuestImage:
    """Paths of one complete image set (all absolute) and its manifest."""

    dir: Path
    rootfs: Path
    vmlinuz: Path
    vmlinux: Path
    initrd: Path
    manifest: dict[str, Any]
    default_cmdline: str


def ansible_playbook() -> str:
    """The venv's ansible-playbook next to the running interpreter."""
    return str(Path(sys.executable).parent / "ansible-playbook")


def ensure_image_set(images_dir: Path = IMAGES_DIR, extra_vars: dict[str, Any] | None = None,
                     timeout: float = BUILD_TIMEOUT_S) -> tuple[GuestImage, subprocess.CompletedProcess[str]]:
    """Run the playbook (build or reuse) and return the set plus the finished process (stdout has the recap).

    Raises:
        RuntimeError: the playbook failed (its output tail is in the message).
    """
    images_dir.mkdir(parents=True, exist_ok=True)
    with open(images_dir / ".guest_image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # A fixed path (under the lock) so a warm run rewrites identical content and reports changed=0.
        report = images_dir / ".guest_image.report.json"
        argv = [ansible_playbook(), "playbooks/guest_image.yml",
                "-e", f"guest_image_dir={images_dir}", "-e", f"guest_image_report_file={report}"]
        for key, value in (extra_vars or {}).items():
            argv += ["-e", json.dumps({key: value})]
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            tail = f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{tail}")
        set_dir = Path(json.loads(report.read_text())["path"])
    manifest = json.loads((set_dir / "manifest.json").read_text())
    image = GuestImage(
        dir=set_dir, rootfs=set_dir / "rootfs.raw", vmlinuz=set_dir / "vmlinuz", vmlinux=set_dir / "vmlinux",
        initrd=set_dir / "initrd.img", manifest=manifest, default_cmdline=manifest["defaultCmdline"],
    )
    return image, proc


def config_disk(instance_id: str, hostname: str, authorized_keys: list[str], network: dict[str, str]) -> bytes:
    """The identity config disk of notes/CONTRACT-guest.md: a ustar archive (multiple of 512 bytes)."""
    members = {
        "instance-id": instance_id + "\n",
        "hostname": hostname + "\n",
        "authorized_keys": "".join(k.strip() + "\n" for k in authorized_keys),
        "network": "".join(f"{k}={v}\n" for k, v in network.items()),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    """The default image set in ``${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}/images`` (built on first use)."""
    from tests.conftest import require  # the CI gate (imported here: tests/conftest.py imports this module)

    require("guest", os.geteuid() == 0, "building the guest image needs root (debootstrap, chroot)")
    image, _ = ensure_image_set()
    return image
