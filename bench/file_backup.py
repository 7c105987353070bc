#!/usr/bin/env python3
"""Backup and restore throughput of zjusct.cloud's verified backup of a ``file`` volume (a sparse raw file, the
quickstart's default) against ``cp --sparse=always`` + ``sha256sum`` of the same file in the same run (goal: ratio
>= 0.8), and the time of an incremental backup after 1 % of the blocks changed against the full backup's (goal:
<= 0.1).

Usage (from the repository root)::

    /var/cache/zjusct-cloud/venv/bin/python bench/file_backup.py [--size-mib 1024] [--fill 0.6] [--rounds 4]
        [--format raw|qcow2] [--workdir DIR]

The volume is a sparse file of ``--size-mib`` MiB whose ``--fill`` fraction of 4 MiB blocks hold random data (the
rest are holes); with ``--format qcow2`` it is then converted to a standalone qcow2 (the backup reads it through
``qemu-img map``; the baselines copy the qcow2 file). Each round measures, alternating which side goes first
(baseline first in even rounds):

* baseline copy: ``cp --sparse=always <volume> <copy> && sha256sum <copy>`` (two processes, timed together), and
  the same plus ``sync <copy>`` (the durable baseline: a backup fsyncs what it stored); for reference also
  ``cp --sparse=always`` + ``sync`` without a checksum (coreutils' ``sha256sum`` hashes in software and reads the
  copy's holes too: it is most of the baseline's time);
* full backup: ``storage.file_backup.backup_volume(force_full=True)`` into a fresh destination (read every block,
  CRC32C per block and per file, write the stream, fsync, re-read and verify, manifest, complete marker);
* restore: ``storage.file_backup.restore_volume`` of that backup into a new file (apply the stream to a sparse file,
  read every block back against the manifest, fsync, link), against the baseline copy;
* incremental: 1 % of the blocks rewritten (random 4 KiB in each), then ``backup_volume`` (a diff: the volume is
  read and checksummed again, only the changed blocks stored), against that round's full backup (pair by pair).

Wall time (monotonic clock) of each; the medians of the rounds and the per-round ratios are printed. Both sides
read the volume from the page cache alike (the caches are not dropped: the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, ".collections"))

from ansible_collections.zjusct.cloud.plugins.module_utils.storage import file_backup as fb  # noqa: E402
from benchlib import timed  # noqa: E402  (bench/benchlib.py)

MiB = 1024 * 1024
BLOCK = 4 * MiB


def make_volume(path: str, size_mib: int, fill: float, rng: random.Random) -> list[int]:
    """A sparse file; returns the indices of the 4 MiB blocks written (random data)."""
    blocks = size_mib * MiB // BLOCK
    written = sorted(rng.sample(range(blocks), max(1, int(blocks * fill))))
    with open(path, "wb") as f:
        f.truncate(size_mib * MiB)
        for i in written:
            f.seek(i * BLOCK)
            f.write(os.urandom(BLOCK))
        f.flush()
        os.fsync(f.fileno())
    return written


def touch_one_percent(path: str, fmt: str, blocks: int, rng: random.Random) -> int:
    """Rewrite 4 KiB in 1 % of the blocks (at least one); returns how many blocks changed."""
    picked = rng.sample(range(blocks), max(1, blocks // 100))
    if fmt == "qcow2":
        cmds = []
        for i in picked:
            cmds += ["-c", f"write -P {rng.randrange(1, 255)} {i * BLOCK + 8192} 4k"]
        subprocess.run(["qemu-io", "-f", "qcow2", *cmds, path], check=True, capture_output=True, timeout=600)
    else:
        with open(path, "r+b") as f:
            for i in picked:
                f.seek(i * BLOCK + 8192)
                f.write(os.urandom(4096))
            f.flush()
            os.fsync(f.fileno())
    return len(picked)


def baseline(src: str, copy: str, durable: bool, checksum: bool = True) -> None:
    subprocess.run(["cp", "--sparse=always", src, copy], check=True)
    if durable:
        subprocess.run(["sync", copy], check=True)
    if checksum:
        subprocess.run(["sha256sum", copy], check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--fill", type=float, default=0.6, help="fraction of 4 MiB blocks holding data (0-1)")
    ap.add_argument("--rounds", type=int, default=4, help="an even number gives each side first equally often")
    ap.add_argument("--format", choices=["raw", "qcow2"], default="raw")
    ap.add_argument("--workdir", default=None, help="where the volume, copies and backups go (default a temp dir)")
    args = ap.parse_args()

    rng = random.Random(20261203)
    work = tempfile.mkdtemp(prefix="file-backup-bench-", dir=args.workdir)
    times: dict[str, list[float]] = {k: [] for k in ("cp+sha256sum", "cp+sync+sha256sum", "cp+sync (no checksum)",
                                                     "full backup", "restore", "incremental")}
    phases: dict[str, list[dict]] = {"full backup": [], "restore": [], "incremental": []}
    stored: list[int] = []
    try:
        vol = os.path.join(work, "volume.raw")
        make_volume(vol, args.size_mib, args.fill, rng)
        if args.format == "qcow2":
            q = os.path.join(work, "volume.qcow2")
            subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", vol, q], check=True)
            os.unlink(vol)
            vol = q
        allocated = os.stat(vol).st_blocks * 512 // MiB
        blocks = args.size_mib * MiB // BLOCK
        for rnd in range(args.rounds):
            dest = os.path.join(work, f"bk-{rnd}")
            copy = os.path.join(work, f"copy-{rnd}")
            target = os.path.join(work, f"restored-{rnd}")

            def ours_backup() -> None:
                res = fb.backup_volume(vol, args.format, dest, force_full=True)  # noqa: B023
                phases["full backup"].append(res["phases"])

            def ours_restore() -> None:
                res = fb.restore_volume(dest, target, args.format)  # noqa: B023
                phases["restore"].append(res["phases"])

            steps = [("cp+sha256sum", lambda: baseline(vol, copy, False)),  # noqa: B023
                     ("full backup", ours_backup)]
            if rnd % 2:  # alternate which side runs first, so a trend in the load does not favour one
                steps.reverse()
            for name, fn in steps:
                times[name].append(timed(fn))
            os.unlink(copy)
            times["cp+sync+sha256sum"].append(timed(lambda: baseline(vol, copy, True)))  # noqa: B023
            os.unlink(copy)
            times["cp+sync (no checksum)"].append(timed(lambda: baseline(vol, copy, True, False)))  # noqa: B023
            os.unlink(copy)
            steps = [("cp+sha256sum", None), ("restore", ours_restore)]
            for name, fn in (steps if rnd % 2 == 0 else steps[::-1]):
                if fn is None:  # the baseline again, for the restore pair (same conditions as the restore)
                    times.setdefault("cp+sha256sum (restore pair)", []).append(
                        timed(lambda: baseline(vol, copy, False)))  # noqa: B023
                    os.unlink(copy)
                else:
                    times[name].append(timed(fn))
            os.unlink(target)
            touch_one_percent(vol, args.format, blocks, rng)
            t0 = time.monotonic()
            res = fb.backup_volume(vol, args.format, dest)
            times["incremental"].append(time.monotonic() - t0)
            assert res["plan"]["type"] == "diff", res["plan"]
            phases["incremental"].append(res["phases"])
            stored.append(res["backup"]["dataBytes"])
            shutil.rmtree(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.format} volume {args.size_mib} MiB, {args.fill:.0%} of blocks written ({allocated} MiB allocated), "
          f"{args.rounds} rounds, median wall seconds:")
    for k, v in times.items():
        print(f"  {k:28s} {med[k]:7.2f} s  {allocated / med[k]:8.1f} MiB/s   ({', '.join(f'{t:.2f}' for t in v)})")
    for k, v in phases.items():
        print(f"  {k} phases (s): {v}")
    print(f"  incremental stored {[s // MiB for s in stored]} MiB of {blocks} blocks x 4 MiB")
    pairs_b = [b / o for b, o in zip(times["cp+sha256sum"], times["full backup"], strict=True)]
    pairs_bd = [b / o for b, o in zip(times["cp+sync+sha256sum"], times["full backup"], strict=True)]
    pairs_r = [b / o for b, o in zip(times["cp+sha256sum (restore pair)"], times["restore"], strict=True)]
    pairs_i = [i / f for i, f in zip(times["incremental"], times["full backup"], strict=True)]
    pairs_c = [b / o for b, o in zip(times["cp+sync (no checksum)"], times["full backup"], strict=True)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for label, values, goal, better in (
            ("backup speed / (cp --sparse=always + sha256sum)", pairs_b, 0.8, "ge"),
            ("backup speed / (cp + sync + sha256sum, durable)", pairs_bd, 0.8, "ge"),
            ("backup speed / (cp + sync, no checksum: reference)", pairs_c, 0.8, "ge"),
            ("restore speed / (cp --sparse=always + sha256sum)", pairs_r, 0.8, "ge"),
            ("incremental time / full backup time (1 % changed)", pairs_i, 0.1, "le")):
        m = statistics.median(values)
        met = m >= goal if better == "ge" else m <= goal
        print(f"same-run ratio {label} = {m:.2f} (per round {', '.join(f'{x:.2f}' for x in values)}; goal "
              f"{'>=' if better == 'ge' else '<='} {goal}) {'goal met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
