"""Benchmark of the README's first command on a fresh machine: ``make quickstart`` in a new Debian 12 root.

Usage (root, from the repository root; needs debootstrap, unshare and the Debian mirror):
    /var/cache/zjusct-cloud/venv/bin/python bench/quickstart_fresh.py [--work DIR] [--keep] [--baseline]

What it does:

* setup (not timed as part of the quickstart): ``debootstrap --variant=minbase bookworm`` of a new root under
  ``--work`` with what a fresh Debian 12 machine has and the README assumes (git, make, python3 with venv,
  ca-certificates, procps, iproute2), this machine's extra CA certificates (``/usr/local/share/ca-certificates``)
  and ``/etc/pip.conf``, so the root reaches the package registries the way this machine does, and a
  ``git clone`` of this checkout's HEAD at ``/root/zc``;
* the run: ``make quickstart`` chrooted into that root inside a private mount namespace (the root bind-mounted
  onto itself, ``/proc``, ``/sys``, ``/dev`` and a fresh ``/run``): nothing of ours is installed there, no
  package, virtualenv, image or debootstrap cache, so apt, pip, the guest image build and the first boot all
  run cold, against the same kernel and CPUs as this machine;
* afterwards: every process whose root is the new root (the launcher, QEMU, SSH) is killed and, unless
  ``--keep``, the root is removed (the logs stay in ``--work``); the network namespace the quickstart made lives
  only in the private mount namespace and goes with it.

``--baseline`` then makes a second fresh root the same way and times ``hack/install-deps.sh`` there, the full
install of ``make test`` (every Debian package, requirements-test.txt, the ansible-test sanity venv), which the
quickstart ran before it had ``--quickstart``: its time next to the quickstart's step 1 is a same-run ratio.

The quickstart's output is echoed and kept in ``--work``/quickstart.log. Prints the setup time, the
quickstart's wall time and each of its five steps (from the ``==> N/5`` lines), its user and system CPU seconds,
the host's load average before and after, and the goal (≤ 300 s). Absolute figures of one run: the machine's load
of the moment counts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL_S = 300.0
PACKAGES = "git,make,python3,python3-venv,ca-certificates,procps,iproute2"
MIRROR = "http://deb.debian.org/debian"
# what a chrooted process keeps of this machine's environment: the registries' CA bundle and pip settings
PASS_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "PIP_DEFAULT_TIMEOUT",
            "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_INDEX_URL", "PIP_TRUSTED_HOST", "http_proxy", "https_proxy",
            "no_proxy")
STEP_RE = re.compile(r"^==> (\d)/5 ")
# run as: unshare --mount --propagation private sh -c SCRIPT _ ROOT COMMAND ENV... (COMMAND: a fixed string below)
NS_SCRIPT = r"""
set -e
root=$1; shift
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
mkdir -p "$root/run/lock"
cmd=$1; shift
exec chroot "$root" /usr/bin/env -i "$@" /bin/bash -c "cd /root/zc && exec $cmd"
"""


def make_root(root: Path) -> float:
    """debootstrap a fresh Debian 12 root with the machine's CA and pip settings, and clone HEAD into it.

    Returns the seconds it took. Raises subprocess.CalledProcessError when debootstrap or git fails.
    """
    t0 = time.monotonic()
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(root), MIRROR],
                   check=True, stdout=subprocess.DEVNULL)
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir():
        for crt in extra.glob("*.crt"):
            shutil.copy2(crt, root / "usr/local/share/ca-certificates" / crt.name)
        subprocess.run(["chroot", str(root), "update-ca-certificates"], check=True, stdout=subprocess.DEVNULL)
    if Path("/etc/pip.conf").is_file():
        shutil.copy2("/etc/pip.conf", root / "etc/pip.conf")
    shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
    subprocess.run(["git", "clone", "-q", str(REPO), str(root / "root/zc")], check=True)
    return time.monotonic() - t0


def processes_in(root: Path) -> list[int]:
    """Pids of the processes whose root directory is ``root``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "root") == str(root):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def clean_up(root: Path, keep: bool) -> None:
    """SIGKILL every process left in ``root`` (a launcher, QEMU, SSH's master), then remove ``root`` unless ``keep``."""
    for pid in processes_in(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not keep:
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


Run = tuple[int, float, dict[int, float], float, float]


def run_in_root(root: Path, log: Path, command: str = "make quickstart") -> Run:
    """Run ``command`` (``make quickstart`` or ``hack/install-deps.sh``) in the checkout in ``root``, its output into
    ``log`` and echoed; return (exit code, wall s, step → start offset s, user s, system s). The output goes through
    a file, not a pipe: the guest's launcher and SSH's ControlPersist master outlive the command and would hold a
    pipe open."""
    env = ["HOME=/root", "TERM=dumb", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    env += [f"{k}={os.environ[k]}" for k in PASS_ENV if k in os.environ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    steps: dict[int, float] = {}
    with open(log, "w") as out, open(log) as follow:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", NS_SCRIPT, "_",
                                 str(root), command, *env],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        pending = ""
        while True:
            done = proc.poll() is not None
            pending += follow.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                print(line, flush=True)
                m = STEP_RE.match(line)
                if m:
                    steps[int(m.group(1))] = time.monotonic() - t0
            if done:
                break
            time.sleep(0.5)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc.returncode, wall, steps, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/zjusct-bench-quickstart"),
                    help="directory for the fresh roots (removed afterwards unless --keep) and the logs")
    ap.add_argument("--keep", action="store_true", help="keep the root (its running VM is still killed)")
    ap.add_argument("--baseline", action="store_true",
                    help="also time the full hack/install-deps.sh in a second fresh root (same-run ratio)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (debootstrap, chroot, unshare)", file=sys.stderr)
        return 2
    root = args.work.resolve() / "root"
    if root.exists():
        print(f"{root} exists: remove it first", file=sys.stderr)
        return 2
    root.mkdir(parents=True)
    load0 = os.getloadavg()[0]
    try:
        setup = make_root(root)
        rc, wall, steps, user, system = run_in_root(root, args.work.resolve() / "quickstart.log")
    finally:
        clean_up(root, args.keep)
    load1 = os.getloadavg()[0]
    print(f"\nsetup (debootstrap of the fresh root + clone, not part of the quickstart): {setup:.0f} s")
    print(f"make quickstart: exit {rc}, {wall:.0f} s wall ({wall / 60:.1f} min), CPU {user:.0f} s user + "
          f"{system:.0f} s system; load average {load0:.1f} -> {load1:.1f} (absolute, one run)")
    bounds = [*sorted(steps.items()), (6, wall)]
    for (step, start), (_next, end) in itertools.pairwise(bounds):
        print(f"  step {step}/5: {end - start:.0f} s")
    verdict = "met" if rc == 0 and wall <= GOAL_S else "not met"
    print(f"goal: <= {GOAL_S:.0f} s on a fresh machine: {verdict}")
    if args.baseline and 1 in steps and 2 in steps:
        base = args.work.resolve() / "baseline-root"
        base.mkdir(parents=True)
        try:
            make_root(base)
            brc, bwall, _steps, buser, bsys = run_in_root(base, args.work.resolve() / "baseline.log",
                                                          "hack/install-deps.sh")
        finally:
            clean_up(base, args.keep)
        install = steps[2] - steps[1]
        print(f"baseline: full hack/install-deps.sh in a fresh root: exit {brc}, {bwall:.0f} s wall, CPU "
              f"{buser:.0f} s user + {bsys:.0f} s system")
        print(f"step 1/5 (install-deps.sh --quickstart) / full install: {install:.0f} / {bwall:.0f} s = "
              f"{install / bwall:.2f} (same-run ratio)")
        rc = rc or brc
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
