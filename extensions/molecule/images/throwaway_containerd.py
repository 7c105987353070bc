"""A throwaway containerd for the Molecule scenario ``images`` (docs/testing.md#molecule).

    python extensions/molecule/images/throwaway_containerd.py up DIR     # create.yml
    python extensions/molecule/images/throwaway_containerd.py down DIR   # destroy.yml

Run from the repository root or with it on ``PYTHONPATH`` (the pid and mount helpers are tests/cluster's).

``up`` writes ``DIR/config.toml`` and starts Debian's containerd with everything of its own under ``DIR``: root
``DIR/root``, state ``DIR/state``, gRPC socket ``DIR/containerd.sock`` (ttrpc next to it), the ``opt`` plugin's
directory ``DIR/opt``, its output in ``DIR/containerd.log``. It only stores and unpacks images: the CRI plugin and
the snapshotters needing special file systems are disabled, no task is ever run, so no shim and nothing under the
node's ``/run/containerd`` or ``/var/lib/containerd`` (a real node's containerd may be running there; it is never
used nor disturbed). The daemon runs in a session of its own (it outlives this command); ``up`` waits until
``ctr version`` answers on the socket and records the pid in ``DIR/containerd.pid``. A containerd already running
for ``DIR`` is left as is. Prints ``started`` or ``running``.

``down`` stops the recorded containerd and any other process whose command line names ``DIR/config.toml`` (pid
reuse guard): SIGTERM, SIGKILL after 15 s, waiting for each to exit. It then unmounts whatever is still mounted
under ``DIR`` (the overlayfs snapshotter's temporary mounts, should an unpack have been cut short) and removes
``DIR``. Prints ``removed`` or ``absent`` (and on stderr what needed SIGKILL).

Exit status 1 with the reason on stderr: containerd or ctr is not installed, the socket path is too long for a
Unix socket, containerd did not answer within 60 s (its log's tail is printed; the process is stopped again), a
mount under ``DIR`` could not be unmounted (``DIR`` is then kept).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster._cluster import kill_pids, pid_is_ours, tail
from tests.cluster._realnode import _mounts_under

# sun_path is 108 bytes with its NUL; the ttrpc socket adds ".ttrpc"
MAX_SOCKET = 107 - len(".ttrpc")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def paths(work: Path) -> dict[str, Path]:
    """The files of the containerd under ``work``."""
    return {name: work / rel for name, rel in (("config", "config.toml"), ("root", "root"), ("state", "state"),
                                               ("opt", "opt"), ("sock", "containerd.sock"),
                                               ("log", "containerd.log"), ("pid", "containerd.pid"))}


def config_toml(work: Path) -> str:
    """containerd 1.6 configuration (version 2) keeping every path under ``work``."""
    p = paths(work)
    return f"""version = 2
root = "{p['root']}"
state = "{p['state']}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{p['sock']}"
[ttrpc]
  address = "{p['sock']}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{p['opt']}"
"""


def _answers(sock: Path) -> bool:
    proc = subprocess.run(["ctr", "--address", str(sock), "version"], capture_output=True, timeout=10, check=False)
    return proc.returncode == 0


def _our_pids(work: Path) -> dict[str, int]:
    """The recorded pid and every process whose command line names this ``work``'s config."""
    p = paths(work)
    marker = str(p["config"])
    found: dict[str, int] = {}
    if p["pid"].is_file():
        found["containerd"] = int(p["pid"].read_text().strip())
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) not in found.values() and pid_is_ours(int(proc.name), marker):
            found[f"pid-{proc.name}"] = int(proc.name)
    return found


def up(work: Path) -> str:
    """Start containerd for ``work`` unless it runs; return ``started`` or ``running``."""
    work = work.resolve()
    p = paths(work)
    if len(str(p["sock"])) > MAX_SOCKET:
        raise SystemExit(f"socket path {p['sock']} is {len(str(p['sock']))} characters, more than a Unix socket "
                         f"allows here ({MAX_SOCKET}); use a shorter scenario directory")
    missing = [tool for tool in ("containerd", "ctr") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"{' and '.join(missing)} not installed (Debian package containerd, hack/apt-packages.txt)")
    if p["pid"].is_file() and pid_is_ours(int(p["pid"].read_text().strip()), str(p["config"])) and _answers(p["sock"]):
        return "running"
    for sub in ("root", "state", "opt"):
        p[sub].mkdir(parents=True, exist_ok=True)
    p["config"].write_text(config_toml(work))
    with p["log"].open("ab") as log:
        proc = subprocess.Popen(["containerd", "--config", str(p["config"])], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    p["pid"].write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers(p["sock"]):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_pids({"containerd": proc.pid}, str(p["config"]), timeout=STOP_TIMEOUT)
            proc.poll()
            raise SystemExit(f"containerd for {work} did not answer on {p['sock']} within {START_TIMEOUT:.0f} s "
                             f"(exit status {proc.returncode}); {p['log']}:\n{tail(p['log'], 30)}")
        time.sleep(0.2)
    return "started"


def down(work: Path) -> str:
    """Stop the containerd of ``work``, unmount what is under it, remove it; return ``removed`` or ``absent``."""
    work = work.resolve()
    if not work.exists():
        return "absent"
    killed = kill_pids(_our_pids(work), str(paths(work)["config"]), timeout=STOP_TIMEOUT)
    if killed:
        print(f"did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM, killed: {', '.join(killed)}", file=sys.stderr)
    for mnt in _mounts_under(work):
        subprocess.run(["umount", mnt], capture_output=True, check=False)
    left = _mounts_under(work)
    if left:
        raise SystemExit(f"still mounted under {work}, not removed: {', '.join(left)}")
    shutil.rmtree(work)
    return "removed"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``up DIR`` or ``down DIR``; prints what was done."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("dir", type=Path, help="the containerd's own directory (created by up, removed by down)")
    args = parser.parse_args(argv)
    print(up(args.dir) if args.action == "up" else down(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
