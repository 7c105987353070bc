#!/usr/bin/env python3
"""Backup and restore throughput of zjusct.cloud's verified RBD backup against raw ``rbd export`` / ``rbd import``
of the same image in the same run (goal: ratio >= 0.8 — integrity must not halve throughput).

Usage (from the repository root)::

    /var/cache/zjusct-cloud/venv/bin/python bench/rbd_backup.py [--size-mib 512] [--fill 1.0] [--rounds 4]

Starts its own single-node Ceph (tests/ceph) unless ``--conf`` names a running cluster. The image is filled with
non-zero data (``--fill`` = fraction of its objects written) so both sides move the same bytes. Each round
measures, in alternating order (raw first in even rounds, ours first in odd ones): raw export of the snapshot
to a file, our full backup (snapshot + export-diff stream checksummed per file and block — CRC32C where
google-crc32c is installed — + fsync + verification of the stored file + manifest), raw import of that file
into a new image, our restore (``rbd import-diff <file>`` while a thread checksums the file, read the new image
back and compare every 4 MiB block). MiB/s = image size / wall time; the median of the rounds is reported.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, ".collections"))

from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd  # noqa: E402
from benchlib import timed  # noqa: E402  (bench/benchlib.py)


def sh(conf: str, *args: str, timeout: float = 1800) -> None:
    subprocess.run(["rbd", "-c", conf, *args], check=True, capture_output=True, timeout=timeout,
                   env=dict(os.environ, LC_ALL="C"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--fill", type=float, default=1.0, help="fraction of 4 MiB objects written (0-1)")
    ap.add_argument("--rounds", type=int, default=4, help="an even number gives each side first equally often")
    ap.add_argument("--conf", default=None, help="use this running cluster instead of starting one")
    ap.add_argument("--workdir", default=None, help="where backup files go (default a temp dir)")
    args = ap.parse_args()

    cluster = None
    if args.conf is None:
        from tests.ceph import start_cluster

        cluster = start_cluster(timeout=300)
        conf = str(cluster.conf)
        print(f"ceph bootstrap: {cluster.bootstrap_seconds:.1f} s")
    else:
        conf = args.conf
    work = tempfile.mkdtemp(prefix="rbd-bench-", dir=args.workdir)
    rbd = Rbd(Connection(conf=conf, timeout=1800))
    results: dict[str, list[float]] = {"raw export": [], "raw export+fsync": [], "backup": [], "raw import": [],
                                       "restore": []}
    phases: list[dict] = []
    restore_phases: list[dict] = []
    try:
        src = ImageRef("rbd", "bench-src")
        rbd.create(src, args.size_mib)
        objects = args.size_mib // 4
        written = max(1, int(objects * args.fill))
        if written == objects:
            sh(conf, "bench", "--io-type", "write", "--io-pattern", "seq", "--io-size", "4M", "--io-total",
               f"{args.size_mib}M", src.spec)
        else:
            sh(conf, "bench", "--io-type", "write", "--io-pattern", "rand", "--io-size", "4M", "--io-total",
               f"{written * 4}M", src.spec)
        rbd.snap_create(src.at("base"))
        for rnd in range(args.rounds):
            raw = os.path.join(work, f"raw-{rnd}.img")
            dest = os.path.join(work, f"bk-{rnd}")
            snap = src.at("base").spec
            ops = {
                "raw export": functools.partial(sh, conf, "export", "--no-progress", snap, raw),
                "backup": functools.partial(bio.backup, rbd, src, dest, force_full=True),
                "raw import": functools.partial(sh, conf, "import", "--no-progress", raw, f"rbd/raw-{rnd}"),
                "restore": functools.partial(bio.restore, rbd, dest, ImageRef("rbd", f"rs-{rnd}")),
            }
            for pair in (["raw export", "backup"], ["raw import", "restore"]):
                if rnd % 2:  # alternate which side runs first, so a trend in the load does not favour one
                    pair.reverse()
                for step in pair:
                    if step == "backup":
                        t0 = time.monotonic()
                        phases.append(bio.backup(rbd, src, dest, force_full=True)["phases"])
                        results[step].append(time.monotonic() - t0)
                        continue
                    if step == "restore":
                        t0 = time.monotonic()
                        restore_phases.append(ops[step]()["phases"])
                        results[step].append(time.monotonic() - t0)
                        continue
                    results[step].append(timed(ops[step]))
                    if step == "raw export":  # the same copy made durable, as a backup must be
                        fd = os.open(raw, os.O_RDONLY)
                        results["raw export+fsync"].append(results[step][-1] + timed(functools.partial(os.fsync, fd)))
                        os.close(fd)
            os.unlink(raw)
            shutil.rmtree(dest)
            for name in (f"raw-{rnd}", f"rs-{rnd}"):
                sh(conf, "rm", "--no-progress", f"rbd/{name}")
            for s in rbd.snapshots(src):
                if s["name"].startswith(bio.SNAP_PREFIX):
                    rbd.snap_remove(src.at(s["name"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cluster is not None:
            cluster.stop()

    mibs = {k: args.size_mib / statistics.median(v) for k, v in results.items()}
    print(f"image {args.size_mib} MiB, {args.fill:.0%} of objects written, {args.rounds} rounds (median):")
    for k, v in mibs.items():
        print(f"  {k:17s} {v:8.1f} MiB/s   ({', '.join(f'{t:.2f}' for t in results[k])} s)")
    print(f"backup phases (s): {phases}")
    print(f"restore phases (s): {restore_phases}")
    b, r = mibs["backup"] / mibs["raw export"], mibs["restore"] / mibs["raw import"]
    bd = mibs["backup"] / mibs["raw export+fsync"]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"same-run ratio backup/raw export  = {b:.2f}  (goal >= 0.8) {'goal met' if b >= 0.8 else 'not met'}")
    print(f"same-run ratio backup/raw export+fsync = {bd:.2f}  (durable baseline) "
          f"{'goal met' if bd >= 0.8 else 'not met'}")
    print(f"same-run ratio restore/raw import = {r:.2f}  (goal >= 0.8) {'goal met' if r >= 0.8 else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
