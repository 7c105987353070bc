#!/usr/bin/env python3
"""Launcher overhead, measured against the same QEMU command run directly, in the same run.

For each of N pairs (the side that runs first alternates: the launcher first in pairs 1, 3, ...; the direct run
first in pairs 2, 4, ..., with the argv the launcher logged in the previous pair, so that neither side always
gets the warmer page cache):
  A. ``python -m zjusct_launcher run``: time from process start to the ready marker (SSH banner seen);
  B. the exact QEMU argv the launcher logged in A (``vmm started``), started directly with the same config disk:
     time from process start to the SSH banner, probed with the launcher's own probe function and interval.
Prints each pair, the ratio mean(A) / mean(B) (goal <= 1.05), the launcher's RSS while the guest runs (its own
process only, VmRSS/VmHWM from /proc; goal <= 30 MiB) and the CPU time it spent before the VMM started.

Guest: the real image when ``$ZJUSCT_CACHE/images/*/manifest.json`` exists and ``--guest image`` (needs an SSH
banner from sshd), else the busybox test guest (tests/integration/launcher/busybox_guest.py). Usage:
  /var/cache/zjusct-cloud/venv/bin/python bench/launcher_overhead.py [--pairs 3] [--guest busybox|image]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "launcher"))
sys.path.insert(0, str(REPO))

from zjusct_launcher import config as cfgmod  # noqa: E402
from zjusct_launcher import identity, readiness  # noqa: E402

from tests.integration.launcher import busybox_guest as bg  # noqa: E402
from tests.integration.launcher.harness import base_config, free_port  # noqa: E402

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))


def guest_files(kind: str, work: Path) -> tuple[str, str, str, str]:
    """(kernel, initrd, disk, cmdline)."""
    if kind == "image":
        manifests = sorted(glob.glob(str(CACHE / "images" / "*" / "manifest.json")))
        if not manifests:
            raise SystemExit("no guest image (images/*/manifest.json); use --guest busybox")
        d = Path(manifests[-1]).parent
        manifest = json.loads(Path(manifests[-1]).read_text())
        disk = work / "root.raw"
        subprocess.run(["cp", "--sparse=always", str(d / "rootfs.raw"), str(disk)], check=True, timeout=300)
        os.chmod(disk, 0o644)
        return str(d / "vmlinuz"), str(d / "initrd.img"), str(disk), manifest["defaultCmdline"]
    kernel, _ = bg.kernel()
    return kernel, bg.build_initrd(), bg.make_disk(str(work / "disk.raw")), "console=ttyS0 panic=-1 quiet zjtest.acpi=1"


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def run_launcher(cfg: dict, work: Path, machine: str | None = None) -> tuple[float, float, list[str], int, int, float]:
    """Returns (seconds to the ready marker, seconds to the banner seen by this script's own probe, vmm argv,
    VmRSS KiB, VmHWM KiB, launcher CPU s before the VMM). ``machine``: run the launcher with its QEMU ``-M``
    value (``zjusct_launcher.qemu.MACHINE``) replaced by this one (None: the launcher's own)."""
    path = work / "config.json"
    path.write_text(json.dumps(cfg))
    err = open(work / "launcher.log", "wb")
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"))
    entry = ["-m", "zjusct_launcher"]
    if machine is not None:
        entry = ["-c", "import sys, zjusct_launcher.qemu as q; from zjusct_launcher.cli import main; "
                 f"q.MACHINE = {machine!r}; sys.exit(main())"]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, *entry, "run", "--config", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
    ready = Path(cfg["runtimeDir"]) / "ready"
    seen: list[float] = []
    probe = threading.Thread(target=lambda: seen.append(_banner_time(cfg, t0)), daemon=True)
    probe.start()
    try:
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() - t0 > 600:
                raise SystemExit(f"launcher ended before ready: {(work / 'launcher.log').read_text()[-2000:]}")
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        probe.join(timeout=600)
        rss, hwm = status_kib(proc.pid, "VmRSS"), status_kib(proc.pid, "VmHWM")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    lines = [json.loads(x) for x in (work / "launcher.log").read_text().splitlines() if x.startswith("{")]
    started = next(x for x in lines if x.get("msg") == "vmm started")
    return elapsed, seen[0] if seen else float("nan"), started["argv"], rss, hwm, \
        started["launcherCpuSecondsBeforeVmm"]


def _banner_time(cfg: dict, t0: float) -> float:
    """This script's own probe (the launcher's function and interval): seconds from t0 to the banner."""
    port = cfg["network"]["hostForwardPort"]
    readiness.wait_for_banner("127.0.0.1", port, 600, threading.Event())
    return time.monotonic() - t0


def run_direct(argv: list[str], cfg: dict) -> float:
    """The same QEMU argv without the launcher: time to the SSH banner, then QMP-less stop (kill)."""
    parsed = cfgmod.parse(cfg)
    runtime = Path(cfg["runtimeDir"])
    runtime.mkdir(parents=True, exist_ok=True)
    (runtime / "identity.tar").write_bytes(identity.build(parsed))
    r = parsed.readiness
    assert r is not None
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        banner = readiness.wait_for_banner(r.host, r.port, 600, threading.Event())
        elapsed = time.monotonic() - t0
        if banner is None:
            raise SystemExit("direct QEMU: no banner")
    finally:
        proc.kill()
        proc.wait()
        for name in ("identity.tar", "qmp.sock"):
            (runtime / name).unlink(missing_ok=True)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--guest", choices=("busybox", "image"), default="busybox")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zjusct-bench-") as tmp:
        work = Path(tmp)
        kernel, initrd, disk, cmdline = guest_files(args.guest, work)
        cfg = base_config(work, "bench", kernel=kernel, initrd=initrd, disk=disk, cmdline=cmdline, port=free_port(),
                          memory_mib=512 if args.guest == "image" else 256)
        if args.guest == "image":
            cfg["hypervisor"]["tcgTranslationCacheMiB"] = 256
        a_times, a_probe, b_times, rss_list, cpu_list = [], [], [], [], []
        argv: list[str] = []
        for i in range(args.pairs):
            if i % 2 == 0:
                a, ap, argv, rss, hwm, cpu = run_launcher(cfg, work)
                b = run_direct(argv, cfg)
            else:  # direct first, with the argv of the previous pair's launcher run (same config)
                b = run_direct(argv, cfg)
                a, ap, again, rss, hwm, cpu = run_launcher(cfg, work)
                if again != argv:
                    print(f"pair {i + 1}: note: the launcher's argv differs from the one the direct run used")
                argv = again
            a_times.append(a)
            a_probe.append(ap)
            b_times.append(b)
            rss_list.append((rss, hwm))
            cpu_list.append(cpu)
            first = "launcher" if i % 2 == 0 else "direct"
            print(f"pair {i + 1} ({first} first): launcher marker {a:.2f} s (banner {ap:.2f} s), direct {b:.2f} s, "
                  f"ratio {a / b:.3f}; launcher VmRSS "
                  f"{rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB), launcher CPU before VMM {cpu:.3f} s",
                  flush=True)
    ratio = statistics.mean(a_times) / statistics.mean(b_times)
    print(f"time to SSH banner: launcher mean {statistics.mean(a_times):.2f} s / direct mean "
          f"{statistics.mean(b_times):.2f} s = ratio {ratio:.3f} (goal <= 1.05, {args.pairs} pairs, guest "
          f"{args.guest})")
    print(f"same, both timed by this script's probe: {statistics.mean(a_probe):.2f} s / "
          f"{statistics.mean(b_times):.2f} s = ratio {statistics.mean(a_probe) / statistics.mean(b_times):.3f}")
    ratios = [a / b for a, b in zip(a_times, b_times, strict=True)]
    print(f"median of per-pair ratios: {statistics.median(ratios):.3f}")
    print(f"launcher RSS (own process, VMM excluded): max VmRSS {max(r for r, _ in rss_list) / 1024:.1f} MiB, "
          f"max VmHWM {max(h for _, h in rss_list) / 1024:.1f} MiB (goal <= 30 MiB)")
    print(f"launcher CPU before the VMM starts: mean {statistics.mean(cpu_list):.3f} s (user+sys, incl. interpreter "
          "start-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
