"""``python -m tests.ceph up`` / ``python -m tests.ceph down [STATE_DIR]`` — a test Ceph cluster by hand.

``up`` bootstraps a cluster, leaves its daemons running and prints shell lines to use it::

    eval "$(python -m tests.ceph up)"     # sets CEPH_CONF and ZJUSCT_CEPH_DIR
    rbd ls rbd
    python -m tests.ceph down             # stops by pid, removes the directory ($ZJUSCT_CEPH_DIR)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .cluster import CephClusterError, start_cluster, stop_cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ceph", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster, print export lines")
    up.add_argument("--base", default=None, help="parent directory for the state dir (default $TMPDIR)")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds per wait (default 120)")
    down = sub.add_parser("down", help="stop a cluster and remove its state dir")
    down.add_argument("state_dir", nargs="?", default=os.environ.get("ZJUSCT_CEPH_DIR"))
    args = parser.parse_args(argv)
    if args.cmd == "up":
        try:
            cluster = start_cluster(args.base, args.timeout)
        except CephClusterError as exc:
            print(f"ceph bootstrap failed: {exc}", file=sys.stderr)
            return 1
        print(f"export CEPH_CONF={shlex.quote(str(cluster.conf))}")
        print(f"export ZJUSCT_CEPH_DIR={shlex.quote(str(cluster.state_dir))}")
        print(f"# keyring {cluster.keyring}; bootstrap {cluster.bootstrap_seconds:.1f} s; "
              f"down: python -m tests.ceph down {cluster.state_dir}")
        return 0
    if not args.state_dir:
        parser.error("down: give the state dir or set ZJUSCT_CEPH_DIR")
    killed = stop_cluster(args.state_dir)
    if killed:
        print(f"had to SIGKILL: {', '.join(killed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
