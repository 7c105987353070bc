"""Benchmark of the guest image set: cold vs warm build, image sizes, boot-to-SSH and powerdown under QEMU/TCG.

Usage (root, from the repository root):
    /var/cache/zjusct-cloud/venv/bin/python bench/guest_image.py [--skip-cold] [--boots N]

* warm: the playbook against the cache dir where the default set exists (manifest check only, changed=0).
* cold: a forced build into a scratch images dir (``${ZJUSCT_CACHE}/bench-images``, removed afterwards); the
  debootstrap download cache stays warm, so this is the build cost without the mirror download.
* sizes: apparent vs allocated bytes of every artefact (rootfs.raw is sparse).
* boot: seconds from starting QEMU (TCG, 1 vCPU, 512 MiB) to the guest's ``SSH-`` banner, and from QMP
  system_powerdown to QEMU's exit.
Prints one line per figure and the cold/warm ratio (both measured in this run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".collections"))

from tests.guest_image_fixture import CACHE, ensure_image_set  # noqa: E402
from tests.integration.guest_image.qemu_vm import Vm, make_key  # noqa: E402


def timed_build(images_dir: Path, force: bool) -> float:
    t0 = time.monotonic()
    ensure_image_set(images_dir, {"guest_image_force": True} if force else None)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-cold", action="store_true", help="skip the forced cold build (minutes)")
    ap.add_argument("--boots", type=int, default=1, help="guest boots to time (default 1)")
    args = ap.parse_args()

    warm_first = timed_build(CACHE / "images", force=False)  # builds if missing; then the set exists
    warm = timed_build(CACHE / "images", force=False)
    print(f"warm build (set present, changed=0): {warm:.1f} s (first call {warm_first:.1f} s)")
    if not args.skip_cold:
        scratch = CACHE / "bench-images"
        try:
            cold = timed_build(scratch, force=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"cold build (forced, download cache warm): {cold:.1f} s")
        print(f"cold/warm ratio: {cold / warm:.1f}")

    image, _ = ensure_image_set(CACHE / "images")
    print(f"image set: {image.dir}  kernel {image.manifest['kernelVersion']}")
    for name in sorted(image.manifest["artifacts"]):
        st = os.stat(image.dir / name)
        print(f"size {name}: apparent {st.st_size / 2**20:.1f} MiB, allocated {st.st_blocks * 512 / 2**20:.1f} MiB")

    with tempfile.TemporaryDirectory(prefix="bench-guest-") as tmp:
        key, pub = make_key(Path(tmp))
        for i in range(args.boots):
            vm = Vm(image, Path(tmp) / f"vm{i}", f"bench{i}", f"bench-{i}-{time.time_ns()}", [pub])
            try:
                t_copy = time.monotonic()
                vm.prepare()
                copy_s = time.monotonic() - t_copy
                vm.start()
                ssh_s = vm.wait_ssh_banner(600)
                login = vm.ssh(key, "systemd-analyze || true")
                t_down = time.monotonic()
                vm.qmp("system_powerdown")
                rc = vm.wait_exit(300)
                down_s = time.monotonic() - t_down
            finally:
                vm.close()
            print(f"boot {i}: rootfs copy {copy_s:.1f} s, start->SSH banner {ssh_s:.1f} s (TCG), "
                  f"powerdown->QEMU exit {down_s:.1f} s (rc {rc})")
            print(f"boot {i}: guest says: {login.strip().splitlines()[0] if login.strip() else '?'}")
    print(f"load average at end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
