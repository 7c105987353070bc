"""Command line: run the test control plane by hand.

    eval "$(python -m tests.cluster up)"     # prints export KUBECONFIG=... and ZJUSCT_K8S_STATE=...
    python -m tests.cluster status
    python -m tests.cluster lose-node node-b  # stop node-b's heartbeat (NotReady + tainted after the grace period)
    python -m tests.cluster restore-node node-b
    python -m tests.cluster node-up           # a real node (containerd + kubelet) joins; one per machine
    python -m tests.cluster node-down         # stop it, undo its host changes
    python -m tests.cluster down              # stop every process by pid, remove the state dir (runs node-down)

``up`` starts a detached supervisor (``_serve``) that owns the daemons and the node heartbeat.
Run from the repository root (or with it on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from ._binaries import BUILD_SCRIPT, REPO, Binaries
from ._cluster import TENANT_NAMESPACE, Cluster, ClusterError, load_state, pid_alive, stop_state_dir, tail
from ._nodes import pause_marker
from ._realnode import RealNode, RealNodeError, find_state, stop_saved

ENV_STATE = "ZJUSCT_K8S_STATE"
ERROR_FILE = "error.txt"


def _state_dir(arg: str | None) -> Path:
    value = arg or os.environ.get(ENV_STATE)
    if not value:
        sys.exit(f"no state dir: pass --state-dir or set {ENV_STATE} (printed by 'up')")
    return Path(value).resolve()


def cmd_up(args: argparse.Namespace) -> int:
    """Start a detached cluster and print shell exports; exit 1 if it does not become usable."""
    binaries = Binaries.pinned()
    if binaries.missing() and args.build:
        subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=sys.stderr)
    reason = binaries.missing_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="zjusct-k8s-")).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "supervisor.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        sup = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.cluster",
                "_serve",
                "--state-dir",
                str(state_dir),
                "--timeout",
                str(args.timeout),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout + 30
    while True:
        if (state_dir / ERROR_FILE).exists() or sup.poll() is not None:
            sup.wait(timeout=30)
            print(f"cluster failed to start; {log}:\n{tail(log, 40)}", file=sys.stderr)
            if (state_dir / "state.json").exists():
                stop_state_dir(state_dir)
            return 1
        try:
            state = load_state(state_dir)
        except (OSError, json.JSONDecodeError):
            state = {}
        if state.get("ready"):
            break
        if time.monotonic() > deadline:
            sup.terminate()
            print(f"timed out; {log}:\n{tail(log, 40)}", file=sys.stderr)
            return 1
        time.sleep(0.3)
    kube = state["kubeconfigs"]
    print(f"export KUBECONFIG={kube['admin']}")
    print(f"export {ENV_STATE}={state_dir}")
    print(
        f"# kubernetes v{state['k8s_version']} at {state['server']}: /readyz after "
        f"{state['timings']['readyz_s']:.1f}s, usable after {state['timings']['usable_s']:.1f}s\n"
        f"# tenant (alice, edit in {TENANT_NAMESPACE}): KUBECONFIG={kube['alice']}\n"
        f"# stop: python -m tests.cluster down",
        file=sys.stderr,
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Supervisor: own the cluster until SIGTERM/SIGINT/SIGHUP, then stop it (state dir kept)."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _exit)
    state_dir = Path(args.state_dir).resolve()
    cluster = Cluster(state_dir=state_dir, keep_state=True)
    try:
        cluster.start(timeout=args.timeout)
    except ClusterError as exc:
        (state_dir / ERROR_FILE).write_text(str(exc))
        print(exc, file=sys.stderr)
        return 1
    try:
        while True:
            signal.pause()
    finally:
        cluster.stop()


def cmd_down(args: argparse.Namespace) -> int:
    """Stop every recorded process by pid and remove the state dir."""
    state_dir = _state_dir(args.state_dir)
    work = find_state(state_dir)
    if work is not None and work.exists():
        stop_saved(work)
    try:
        killed = stop_state_dir(state_dir)
    except FileNotFoundError:
        print(f"no cluster state in {state_dir}", file=sys.stderr)
        return 1
    print(
        f"stopped cluster in {state_dir}" + (f" (SIGKILL needed: {', '.join(killed)})" if killed else ""),
        file=sys.stderr,
    )
    return 0


def cmd_node_up(args: argparse.Namespace) -> int:
    """Start a detached real node (supervisor ``_node-serve``) for the cluster; exit 1 if it does not get Ready."""
    state_dir = _state_dir(args.state_dir)
    load_state(state_dir)
    existing = find_state(state_dir)
    if existing is not None and existing.exists():
        print(f"a real node already runs for {state_dir} (node-down first)", file=sys.stderr)
        return 1
    log = state_dir / "real-node-supervisor.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        sup = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster", "_node-serve", "--state-dir", str(state_dir),
             "--name", args.name, "--timeout", str(args.timeout)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout + 60
    while True:
        work = find_state(state_dir)
        if sup.poll() is not None:
            print(f"real node failed to start; {log}:\n{tail(log, 40)}", file=sys.stderr)
            return 1
        if work is not None and (work / "ready").exists():
            break
        if time.monotonic() > deadline:
            sup.terminate()
            sup.wait(timeout=120)
            print(f"timed out; {log}:\n{tail(log, 40)}", file=sys.stderr)
            return 1
        time.sleep(0.3)
    info = json.loads((work / "ready").read_text())
    print(
        f"# real node {args.name} ({info['ip']}) Ready {info['timings']['ready_s']:.1f}s after kubelet start; "
        f"work dir {work}\n# pods: nodeSelector kubernetes.io/hostname={args.name}, toleration "
        f"cloud.zjusct.io/real-node (NoSchedule), images "
        f"{info['images']['busybox']} (imagePullPolicy: Never)\n# stop: python -m tests.cluster node-down",
        file=sys.stderr,
    )
    return 0


def cmd_node_serve(args: argparse.Namespace) -> int:
    """Supervisor of a real node: hold the machine lock and the daemons until SIGTERM/SIGINT/SIGHUP."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _exit)
    state_dir = Path(args.state_dir).resolve()
    node = RealNode(state_dir, name=args.name)
    (state_dir / "real-node.work").write_text(f"{node.work}\n")
    try:
        node.start(timeout=args.timeout)
    except (RealNodeError, TimeoutError) as exc:
        print(exc, file=sys.stderr)
        (state_dir / "real-node.work").unlink(missing_ok=True)
        return 1
    try:
        info = {"ip": node.ip, "timings": node.timings, "images": {k: str(v) for k, v in node.images.items()}}
        (node.work / "ready").write_text(json.dumps(info) + "\n")
        while True:
            signal.pause()
    finally:
        node.stop()
        (state_dir / "real-node.work").unlink(missing_ok=True)


def cmd_node_down(args: argparse.Namespace) -> int:
    """Stop the real node of the cluster (its supervisor, else directly from its saved state)."""
    state_dir = _state_dir(args.state_dir)
    work = find_state(state_dir)
    if work is None or not work.exists():
        print(f"no real node for {state_dir}", file=sys.stderr)
        (state_dir / "real-node.work").unlink(missing_ok=True)
        return 1
    killed = stop_saved(work)
    (state_dir / "real-node.work").unlink(missing_ok=True)
    print(f"stopped real node in {work}" + (f" (SIGKILL needed: {', '.join(killed)})" if killed else ""),
          file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print the state and which recorded processes are alive; exit 1 if any is dead."""
    state = load_state(_state_dir(args.state_dir))
    ok = True
    for name, pid in state["pids"].items():
        alive = pid_alive(int(pid))
        ok &= alive
        print(f"{name:24} pid {pid:<8} {'running' if alive else 'DEAD'}")
    print(f"server {state['server']}  kubernetes v{state['k8s_version']}  etcd v{state['etcd_version']}")
    return 0 if ok else 1


def cmd_node(args: argparse.Namespace) -> int:
    """Pause (lose-node) or resume (restore-node) one node's heartbeat."""
    state_dir = _state_dir(args.state_dir)
    names = [n["name"] for n in load_state(state_dir)["nodes"]]
    if args.node not in names:
        print(f"unknown node {args.node}; nodes: {', '.join(names)}", file=sys.stderr)
        return 1
    marker = pause_marker(state_dir, args.node)
    if args.cmd == "lose-node":
        marker.touch()
    else:
        marker.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tests.cluster``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a detached cluster, print export lines")
    up.add_argument("--state-dir", help="state directory (default: a new /tmp/zjusct-k8s-*)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait until usable")
    up.add_argument("--build", action="store_true", help="run hack/build-k8s.sh first if binaries are missing")
    up.set_defaults(func=cmd_up)
    serve = sub.add_parser("_serve", help=argparse.SUPPRESS)
    serve.add_argument("--state-dir", required=True)
    serve.add_argument("--timeout", type=float, default=180.0)
    serve.set_defaults(func=cmd_serve)
    for name, func, text in (
        ("down", cmd_down, "stop everything, remove the state dir"),
        ("status", cmd_status, "show processes"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--state-dir", help=f"default: ${ENV_STATE}")
        p.set_defaults(func=func)
    node_up = sub.add_parser("node-up", help="start a real node (containerd + kubelet) for the cluster")
    node_up.add_argument("--state-dir", help=f"default: ${ENV_STATE}")
    node_up.add_argument("--name", default="real-node", help="Node name (default: real-node)")
    node_up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait until Ready")
    node_up.set_defaults(func=cmd_node_up)
    node_serve = sub.add_parser("_node-serve", help=argparse.SUPPRESS)
    node_serve.add_argument("--state-dir", required=True)
    node_serve.add_argument("--name", default="real-node")
    node_serve.add_argument("--timeout", type=float, default=180.0)
    node_serve.set_defaults(func=cmd_node_serve)
    node_down = sub.add_parser("node-down", help="stop the real node, undo its host changes")
    node_down.add_argument("--state-dir", help=f"default: ${ENV_STATE}")
    node_down.set_defaults(func=cmd_node_down)
    for name, text in (("lose-node", "stop a node's heartbeat"), ("restore-node", "resume a node's heartbeat")):
        p = sub.add_parser(name, help=text)
        p.add_argument("node")
        p.add_argument("--state-dir", help=f"default: ${ENV_STATE}")
        p.set_defaults(func=cmd_node)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
