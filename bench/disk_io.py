#!/usr/bin/env python3
"""Disk I/O limits (``rootDisk.ioLimits``, QEMU's block I/O throttling) as the guest sees them, and a noisy neighbour.

Boots two guests of the cached Debian image through the launcher (user-mode network, QEMU/TCG, 1 vCPU / 512 MiB,
each on a fresh copy of the root file system): the **victim**, whose root disk has a write limit and a read IOPS
limit, and the **neighbour**, without limits. In the victim, dd with O_DIRECT (every request reaches the VMM) writes
``--write-mib`` MiB and reads 4 KiB blocks of ``/dev/vda``, first alone, then while the neighbour writes its own
disk as fast as it can (dd in a loop). fio is not in the guest image; dd's own byte count and time are what is
measured. Prints each round, then the same-run ratios: what the victim saw over its limit alone and next to the
neighbour (1.0 = the limit exactly; the throttle's burst is a tenth of a second's worth), the victim's rate next to
the neighbour over its rate alone, and the neighbour's unlimited rate over the victim's limit. Usage:
  /var/cache/zjusct-cloud/venv/bin/python bench/disk_io.py [--rounds 3] [--write-limit-mib 8] [--read-iops 300]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.launcher.harness import Launched, base_config, free_port  # noqa: E402

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
DD_LINE = re.compile(r"^(\d+) bytes .* copied, ([0-9.]+) s,", re.M)


def image() -> tuple[Path, dict]:
    """The newest cached image set: (its directory, its manifest)."""
    manifests = sorted(glob.glob(str(CACHE / "images" / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"no guest image under {CACHE}/images (make test or make quickstart builds it)")
    return Path(manifests[-1]).parent, json.loads(Path(manifests[-1]).read_text())


class Guest:
    """One guest booted by the launcher, reached over SSH on its forwarded port."""

    def __init__(self, root: Path, name: str, set_dir: Path, manifest: dict, key: Path, limits: dict) -> None:
        work = root / name
        work.mkdir()
        disk = work / "root.raw"
        subprocess.run(["cp", "--sparse=always", str(set_dir / "rootfs.raw"), str(disk)], check=True, timeout=600)
        self.port, self.key = free_port(), key
        cfg = base_config(work, f"bench-{name}", kernel=str(set_dir / "vmlinuz"), initrd=str(set_dir / "initrd.img"),
                          disk=str(disk), cmdline=manifest["defaultCmdline"], port=self.port, memory_mib=512)
        cfg["identity"]["sshAuthorizedKeys"] = [key.with_suffix(".pub").read_text().strip()]
        cfg["hypervisor"]["tcgTranslationCacheMiB"] = 128
        cfg["readiness"] = {"timeoutSeconds": 1500}
        if limits:
            cfg["rootDisk"]["ioLimits"] = limits
        self.launched = Launched(cfg, work)

    def ssh(self, command: str, background: bool = False) -> subprocess.CompletedProcess | subprocess.Popen:
        argv = ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes", "-o",
                "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=60", "-o",
                "LogLevel=ERROR", "root@127.0.0.1", command]
        if background:
            return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)

    def dd(self, args: str) -> tuple[int, float]:
        """(bytes, seconds) of one dd in the guest, as dd reports them."""
        out = self.ssh(f"dd {args} 2>&1 >/dev/null")
        found = DD_LINE.search(out.stdout)
        if not found:
            raise SystemExit(f"dd {args}: {out.stdout!r}")
        return int(found.group(1)), float(found.group(2))

    def stop(self) -> None:
        self.launched.signal()
        self.launched.wait(timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-mib", type=int, default=24, help="MiB each write round writes")
    ap.add_argument("--write-limit-mib", type=int, default=8, help="the victim's writeBytesPerSecond in MiB/s")
    ap.add_argument("--read-iops", type=int, default=300, help="the victim's readIOPS")
    args = ap.parse_args()
    set_dir, manifest = image()
    write_limit = args.write_limit_mib * 2**20
    write = f"if=/dev/zero of=/var/tmp/bench-io bs=1M count={args.write_mib} oflag=direct conv=fsync"
    read = f"if=/dev/vda of=/dev/null bs=4k count={args.read_iops * 4} skip=4096 iflag=direct"
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[0]
    with tempfile.TemporaryDirectory(prefix="zjc-bench-io-") as tmp:
        root = Path(tmp)
        key = root / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
        victim = Guest(root, "victim", set_dir, manifest, key,
                       {"writeBytesPerSecond": write_limit, "readIOPS": args.read_iops})
        neighbour = Guest(root, "neighbour", set_dir, manifest, key, {})
        try:
            victim.launched.wait_ready(1500)
            neighbour.launched.wait_ready(1500)
            rates: dict[str, list[float]] = {k: [] for k in ("write alone", "read alone", "write noisy",
                                                              "read noisy", "neighbour")}
            for rnd in range(args.rounds):
                b, s = victim.dd(write)
                rates["write alone"].append(b / s)
                b, s = victim.dd(read)
                rates["read alone"].append(b / 4096 / s)
                noise = neighbour.ssh("while :; do dd if=/dev/zero of=/var/tmp/noise bs=1M count=256 oflag=direct"
                                      " 2>/dev/null; done", background=True)
                try:
                    b, s = neighbour.dd("if=/dev/zero of=/var/tmp/probe bs=1M count=64 oflag=direct")
                    rates["neighbour"].append(b / s)
                    b, s = victim.dd(write)
                    rates["write noisy"].append(b / s)
                    b, s = victim.dd(read)
                    rates["read noisy"].append(b / 4096 / s)
                finally:
                    noise.terminate()
                    noise.wait(timeout=60)
                    neighbour.ssh("pkill -x dd; rm -f /var/tmp/noise /var/tmp/probe; true")
                print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1] / (2**20 if 'read' not in k else 1):.2f}"
                                                       f"{' MiB/s' if 'read' not in k else ' req/s'}"
                                                       for k, v in rates.items()), flush=True)
        finally:
            for g in (victim, neighbour):
                try:
                    g.stop()
                except Exception as exc:  # the other guest is still stopped
                    print(f"stop: {exc}", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    with open("/proc/loadavg") as fh:
        load_after = fh.read().split()[0]
    print(f"load {load_before} -> {load_after}; medians of {args.rounds} rounds; limits: write"
          f" {args.write_limit_mib} MiB/s, read {args.read_iops} requests/s")
    print(f"victim write alone / limit: {med['write alone'] / write_limit:.3f}")
    print(f"victim write next to the neighbour / limit: {med['write noisy'] / write_limit:.3f}")
    print(f"victim read alone / limit: {med['read alone'] / args.read_iops:.3f}")
    print(f"victim read next to the neighbour / limit: {med['read noisy'] / args.read_iops:.3f}")
    print(f"victim write next to the neighbour / alone: {med['write noisy'] / med['write alone']:.3f}")
    print(f"neighbour's unlimited write / the victim's limit: {med['neighbour'] / write_limit:.1f}"
          f" ({med['neighbour'] / 2**20:.1f} MiB/s)")


if __name__ == "__main__":
    main()
