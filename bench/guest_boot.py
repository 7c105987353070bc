#!/usr/bin/env python3
"""Guest boot time under TCG: the image's default kernel command line vs variants of it, or the launcher's TCG CPU
model vs others (``--cpu``), in the same run.

Every test that boots a guest, the quickstart and the Molecule scenarios wait for a first boot of the cached
Debian image (QEMU/TCG: no nested KVM here), so the guest's own boot is most of their time. This bench boots the
image through the launcher (``python -m zjusct_launcher run``, user-mode network, 1 vCPU / 512 MiB, TCG
translation cache 256 MiB) once per variant per round, each boot a first boot of a fresh copy of the root file
system (new SSH host keys, as a new VM), and takes the time from the launcher's start to its ready marker (the
guest's SSH banner). The variants run in a rotated order each round, so none is always first.

Variants (``--variant NAME`` picks some; ``verbose`` is always the baseline):
  verbose   the manifest's ``defaultCmdline`` without ``quiet`` (every kernel message and systemd status line on
            the serial console, as the image had it before 2026-12-01)
  quiet     + ``quiet`` (kernel messages below warning and systemd's status lines stay off the serial console; the
            image's default now)
  lean      + ``quiet`` and ``systemd.mask=`` for units a cloud guest without EFI, FUSE, binfmt or kernel debugging
            does not use (names in LEAN_MASKS; the image masks them itself since 2026-12-08, role variable
            ``guest_image_masked_units``, so on a current image this variant measures the cost of the mask
            arguments alone)
With ``--cpu`` the variants are ``hypervisor.tcgCPUModel`` values instead, all with the image's own command line:
``max`` (the launcher's model before 2026-12-02; the baseline), ``qemu64,+rdrand`` (its default since) and
``Nehalem,+rdrand`` (x86-64-v2). With ``--machine`` the variants are QEMU ``-M`` values, the launcher's own
(``zjusct_launcher.qemu.MACHINE``, q35 without AHCI, SMBus, PS/2 and the VMware port, since launcher 1.1.1)
against plain ``q35`` (the launcher's machine until then; the baseline): the same launcher, its ``MACHINE``
replaced in its process. Prints each boot, then per variant the median and the same-run ratio
median(variant) / median(baseline), with the load average before and after. Usage:
  /var/cache/zjusct-cloud/venv/bin/python bench/guest_boot.py [--rounds 3] [--variant quiet --variant lean]
  /var/cache/zjusct-cloud/venv/bin/python bench/guest_boot.py --cpu [--rounds 3]
  /var/cache/zjusct-cloud/venv/bin/python bench/guest_boot.py --machine [--rounds 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launcher_overhead import run_launcher
from zjusct_launcher.qemu import MACHINE

from tests.integration.launcher.harness import base_config, free_port

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
# systemd units of a Debian bookworm minbase that a cloud guest (no EFI, no FUSE, no binfmt_misc, no kernel
# debugging or tracing file systems) does not need at boot: the guest_image role's default guest_image_masked_units,
# here masked with systemd.mask= (systemd-system.conf(5), kernel command line).
LEAN_MASKS = tuple(yaml.safe_load((Path(__file__).resolve().parents[1] / "roles" / "guest_image" / "defaults"
                                   / "main.yml").read_text())["guest_image_masked_units"])
CPU_MODELS = ("max", "qemu64,+rdrand", "Nehalem,+rdrand")  # the first is the --cpu baseline
MACHINES = ("q35", MACHINE)  # the first is the --machine baseline
VARIANTS = {
    "verbose": "",
    "quiet": "quiet",
    "lean": " ".join(["quiet", *(f"systemd.mask={u}" for u in LEAN_MASKS)]),
}


def image() -> tuple[Path, dict]:
    """The newest cached image set: (its directory, its manifest)."""
    manifests = sorted(glob.glob(str(CACHE / "images" / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"no guest image under {CACHE}/images (make test or make quickstart builds it)")
    return Path(manifests[-1]).parent, json.loads(Path(manifests[-1]).read_text())


def boot(set_dir: Path, cmdline: str, work: Path, cpu_model: str | None = None, machine: str | None = None) -> float:
    """One first boot of a fresh root copy with ``cmdline`` (and ``hypervisor.tcgCPUModel``, None: the
    launcher's default; QEMU ``-M`` ``machine``, None: the launcher's): seconds from the launcher's start to
    ready."""
    disk = work / "root.raw"
    subprocess.run(["cp", "--sparse=always", str(set_dir / "rootfs.raw"), str(disk)], check=True, timeout=600)
    name = f"boot-{uuid.uuid4().hex[:8]}"
    cfg = base_config(work, name, kernel=str(set_dir / "vmlinuz"), initrd=str(set_dir / "initrd.img"),
                      disk=str(disk), cmdline=cmdline, port=free_port(), memory_mib=512)
    cfg["hypervisor"]["tcgTranslationCacheMiB"] = 256
    if cpu_model is not None:
        cfg["hypervisor"]["tcgCPUModel"] = cpu_model
    try:
        elapsed = run_launcher(cfg, work, machine=machine)[0]
    finally:
        disk.unlink(missing_ok=True)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", choices=[v for v in VARIANTS if v != "verbose"])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="compare TCG CPU models (CPU_MODELS) instead")
    mode.add_argument("--machine", action="store_true", help="compare QEMU machines (MACHINES) instead")
    args = parser.parse_args()
    set_dir, manifest = image()
    if args.cpu or args.machine:
        names = list(CPU_MODELS if args.cpu else MACHINES)
        print(f"image {set_dir.name}; cmdline {manifest['defaultCmdline']}; {'-cpu' if args.cpu else '-M'} "
              f"variants, baseline {names[0]}")
    else:
        names = ["verbose", *(args.variant or [v for v in VARIANTS if v != "verbose"])]
        base = " ".join(t for t in manifest["defaultCmdline"].split() if t != "quiet")
        print(f"image {set_dir.name}; its cmdline without quiet: {base}")
        for n in names[1:]:
            print(f"  {n}: + {VARIANTS[n]}")
    load0 = os.getloadavg()[0]
    times: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="zjusct-bench-boot-") as tmp:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                if args.cpu:
                    t = boot(set_dir, manifest["defaultCmdline"], Path(tmp), cpu_model=n)
                elif args.machine:
                    t = boot(set_dir, manifest["defaultCmdline"], Path(tmp), machine=n)
                else:
                    t = boot(set_dir, f"{base} {VARIANTS[n]}".strip(), Path(tmp))
                times[n].append(t)
                print(f"round {r + 1}: {n:16s} {t:7.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    ref = statistics.median(times[names[0]])
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {args.rounds} rounds, same-run ratios:")
    for n in names:
        m = statistics.median(times[n])
        print(f"  {n:16s} median {m:7.2f} s (runs {min(times[n]):.2f}-{max(times[n]):.2f}) ratio {m / ref:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
