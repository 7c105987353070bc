"""``hack/cluster.sh`` = ``python -m zjusct_localcluster``: a Kubernetes cluster on this machine (docs/kubernetes.md).

    hack/cluster.sh up [--nodes N] [--no-ceph] [--ceph-osds K] [--build]   # prints export lines: eval "$(...)"
    hack/cluster.sh status
    hack/cluster.sh lose-node node-2 [--how poweroff|agents|partition]
    hack/cluster.sh restore-node node-2
    hack/cluster.sh down

The state dir is /var/lib/zjusct-localcluster (``--state-dir`` or ``$ZJUSCT_LOCALCLUSTER`` change it); the admin
kubeconfig is ``<state>/control-plane/kubeconfig/admin.kubeconfig``. ``up`` starts a detached supervisor
(``_serve``) that owns every daemon (they die with it) and answers ``lose-node``/``restore-node``/``status`` on
``<state>/control.sock``; ``down`` stops it, then undoes from the saved state whatever is left.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from .binaries import BUILD_SCRIPT, REPO, Binaries
from .cluster import (
    DEFAULT_STATE_DIR,
    LocalCluster,
    LocalClusterError,
    down_from_state,
    load_state,
    lock_holder,
    missing_reason,
    status_from_state,
)
from .controlplane import pid_alive, pid_is_ours, tail
from .node import LOCK_PATH
from .nsnode import LOSS_MODES

ENV_STATE = "ZJUSCT_LOCALCLUSTER"
CONTROL_SOCKET = "control.sock"
ERROR_FILE = "error.txt"
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _state_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get(ENV_STATE) or DEFAULT_STATE_DIR).resolve()


def _lock_busy() -> str | None:
    """None when the machine lock is free now, else what its file says about the holder."""
    try:
        fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock_holder()
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


def _supervisor_alive(state: dict[str, Any]) -> bool:
    pid = int(state.get("supervisor") or 0)
    return bool(pid) and pid != os.getpid() and pid_is_ours(pid, "zjusct_localcluster")


# --------------------------------------------------------------------------- up / _serve


def cmd_up(args: argparse.Namespace) -> int:
    """Start a detached local cluster; print export lines; exit 1 (with the reason) if it does not come up."""
    if args.build and (Binaries.pinned().missing() or missing_reason(not args.no_ceph)):
        env = {**os.environ, "K8S_EXTRA_BINS": os.environ.get("K8S_EXTRA_BINS", "kubectl")}
        subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=sys.stderr, env=env)
    reason = missing_reason(not args.no_ceph)
    if reason:
        print(f"cannot start: {reason}", file=sys.stderr)
        return 1
    state_dir = _state_dir(args.state_dir)
    with contextlib.suppress(FileNotFoundError):
        state = load_state(state_dir)
        if _supervisor_alive(state):
            print(f"a local cluster already runs in {state_dir} (hack/cluster.sh status; down first)", file=sys.stderr)
            return 1
        print(f"removing what a stopped local cluster left in {state_dir}", file=sys.stderr)
        down_from_state(state_dir, state)
    try:  # validate before anything is spawned: the error names the option
        LocalCluster(state_dir=state_dir, nodes=args.nodes, ceph=not args.no_ceph, ceph_osds=args.ceph_osds)
    except ValueError as exc:
        print(f"hack/cluster.sh up: {exc}", file=sys.stderr)
        return 2
    holder = _lock_busy()
    if holder is not None:
        print(f"waiting (up to 15 min) for the machine lock {LOCK_PATH}, held by: {holder or 'unknown'}",
              file=sys.stderr)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / ERROR_FILE).unlink(missing_ok=True)
    log = state_dir / "supervisor.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_DIR), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "zjusct_localcluster", "_serve", "--state-dir", str(state_dir), "--nodes",
            str(args.nodes), "--ceph-osds", str(args.ceph_osds), "--timeout", str(args.timeout)]
    if args.no_ceph:
        argv.append("--no-ceph")
    t0 = time.monotonic()
    with log.open("ab") as out:
        sup = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                               env=env, start_new_session=True)
    deadline = time.monotonic() + args.timeout + 60 + (900 if holder is not None else 0)
    while True:
        if (state_dir / ERROR_FILE).exists() or sup.poll() is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                sup.wait(timeout=300)  # it has undone what it made (the state dir with it) by the time it exits
            error = tail(state_dir / ERROR_FILE, 60) or tail(log, 40)
            shutil.rmtree(state_dir, ignore_errors=True)
            print(f"local cluster failed to start (everything it made is undone):\n{error}", file=sys.stderr)
            return 1
        with contextlib.suppress(OSError, ValueError):
            if load_state(state_dir).get("ready"):
                break
        if time.monotonic() > deadline:
            sup.terminate()
            print(f"timed out after {args.timeout}s; {log}:\n{tail(log, 40)}", file=sys.stderr)
            return 1
        time.sleep(0.3)
    state = load_state(state_dir)
    print(f"export KUBECONFIG={state['kubeconfig']}")
    if state.get("ceph_conf"):
        print(f"export CEPH_CONF={state['ceph_conf']}")
    print(f"export {ENV_STATE}={state_dir}")
    nodes = ", ".join(f"{a['name']}" for a in state["addressing"])
    print(f"# up in {time.monotonic() - t0:.1f}s: kubernetes at {state['server']}, nodes {nodes}"
          + (f", Ceph ({args.ceph_osds} OSDs; Pods: mount {state['ceph_client_dir']} at /etc/ceph)"
             if state.get("ceph_conf") else "")
          + f"\n# tenant alice: KUBECONFIG={state['tenant_kubeconfig']}\n"
          "# next: hack/cluster.sh status | lose-node NAME | restore-node NAME | down", file=sys.stderr)
    return 0


class _Control(socketserver.StreamRequestHandler):
    """One JSON request line -> one JSON reply line, handled in the supervisor's main thread (the daemons a
    restore starts get PR_SET_PDEATHSIG, which fires when the thread that forked them ends)."""

    cluster: LocalCluster

    def handle(self) -> None:
        try:
            req = json.loads(self.rfile.readline())
            cmd = req.get("cmd")
            if cmd == "lose-node":
                self.cluster.lose_node(str(req["node"]), str(req.get("how", "poweroff")))
                reply: dict[str, Any] = {"ok": True}
            elif cmd == "restore-node":
                t0 = time.monotonic()
                self.cluster.restore_node(str(req["node"]), float(req.get("timeout", 300)))
                reply = {"ok": True, "seconds": round(time.monotonic() - t0, 2)}
            elif cmd == "rss":
                reply = {"ok": True, "rss_kib": {n: node.rss_kib() for n, node in self.cluster.nodes.items()}}
            else:
                reply = {"ok": False, "error": f"unknown command {cmd!r}"}
        except (LocalClusterError, KeyError, ValueError) as exc:
            reply = {"ok": False, "error": str(exc)}
        self.wfile.write((json.dumps(reply) + "\n").encode())


def cmd_serve(args: argparse.Namespace) -> int:
    """Supervisor: own the local cluster until SIGTERM/SIGINT/SIGHUP, then stop it."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _exit)
    state_dir = Path(args.state_dir).resolve()
    cluster = LocalCluster(state_dir=state_dir, nodes=args.nodes, ceph=not args.no_ceph, ceph_osds=args.ceph_osds,
                           keep_state=False)
    try:
        cluster.start(timeout=args.timeout)
    except (LocalClusterError, TimeoutError) as exc:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / ERROR_FILE).write_text(str(exc))
        print(exc, file=sys.stderr)
        return 1
    sock = state_dir / CONTROL_SOCKET
    sock.unlink(missing_ok=True)
    _Control.cluster = cluster
    try:
        with socketserver.UnixStreamServer(str(sock), _Control) as server:
            sock.chmod(0o600)
            server.serve_forever()
    finally:
        cluster.stop()
    return 0


# --------------------------------------------------------------------------- the other commands


def _ask(state_dir: Path, request: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(state_dir / CONTROL_SOCKET))
        s.sendall((json.dumps(request) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return dict(json.loads(data or b'{"ok": false, "error": "no reply"}'))


def cmd_node(args: argparse.Namespace) -> int:
    """lose-node / restore-node through the supervisor."""
    state_dir = _state_dir(args.state_dir)
    try:
        state = load_state(state_dir)
    except FileNotFoundError:
        print(f"no local cluster in {state_dir}", file=sys.stderr)
        return 1
    names = [a["name"] for a in state["addressing"]]
    if args.node not in names:
        print(f"{args.cmd} {args.node}: no such node; nodes: {', '.join(names)}", file=sys.stderr)
        return 2
    if not _supervisor_alive(state):
        print(f"the supervisor of {state_dir} is not running (hack/cluster.sh down, then up)", file=sys.stderr)
        return 1
    request: dict[str, Any] = {"cmd": args.cmd, "node": args.node}
    if args.cmd == "lose-node":
        request["how"] = args.how
    reply = _ask(state_dir, request)
    if not reply.get("ok"):
        print(f"{args.cmd} {args.node}: {reply.get('error')}", file=sys.stderr)
        return 1
    what = LOSS_MODES[args.how] if args.cmd == "lose-node" else f"Ready again after {reply['seconds']}s"
    print(f"{args.node}: {what}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print what runs; exit 1 if any process of a ready cluster is dead or a node's link is down."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `status | head` ends quietly (never set in the supervisor)
    state_dir = _state_dir(args.state_dir)
    try:
        st = status_from_state(state_dir)
    except FileNotFoundError:
        print(f"no local cluster in {state_dir}")
        return 1
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print(f"state {state_dir}  ready {st['ready']}  supervisor {'running' if st['supervisor'] else 'DEAD'}")
        print(f"server {st['server']}  KUBECONFIG={st['kubeconfig']}")
        print("control plane: " + "  ".join(f"{n} {'up' if a else 'DEAD'}" for n, a in st["control_plane"].items()))
        for name, info in st["nodes"].items():
            agents = "  ".join(f"{k} {'up' if info[k] else 'DOWN'}"
                               for k in ("containerd", "kubelet", "kube-proxy", "kube-router", "link"))
            print(f"node {name:8} {info['ip']:12} pods {info['pod_cidr']:15} {agents}")
        if st["ceph"]:
            print(f"ceph (CEPH_CONF={st['ceph_conf']}): "
                  + "  ".join(f"{n} {'up' if a else 'DEAD'}" for n, a in st["ceph"].items()))
    flags = [st["supervisor"], *st["control_plane"].values(), *st["ceph"].values()]
    for info in st["nodes"].values():
        flags += [info[k] for k in ("containerd", "kubelet", "kube-proxy", "kube-router", "link")]
    return 0 if st["ready"] and all(flags) else 1


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the supervisor (it tears everything down), then undo from the saved state whatever is left."""
    state_dir = _state_dir(args.state_dir)
    try:
        state = load_state(state_dir)
    except FileNotFoundError:
        print(f"no local cluster in {state_dir}", file=sys.stderr)
        return 0
    sup = int(state.get("supervisor") or 0)
    if _supervisor_alive(state):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + 180
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(sup):
            os.kill(sup, signal.SIGKILL)
            time.sleep(1)
    if (state_dir / "localcluster.json").exists():  # the supervisor was gone or did not finish
        down_from_state(state_dir, load_state(state_dir))
    shutil.rmtree(state_dir, ignore_errors=True)
    print(f"local cluster in {state_dir} is down", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m zjusct_localcluster`` (``hack/cluster.sh``)."""
    parser = argparse.ArgumentParser(prog="hack/cluster.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    def state_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", help=f"default: ${ENV_STATE} or {DEFAULT_STATE_DIR}")

    for name, hidden in (("up", False), ("_serve", True)):
        p = sub.add_parser(name, help=argparse.SUPPRESS if hidden else "start the cluster, print export lines")
        state_arg(p)
        p.add_argument("--nodes", type=int, default=2, help="real nodes, 1..3 (default 2)")
        p.add_argument("--no-ceph", action="store_true", help="no Ceph cluster")
        p.add_argument("--ceph-osds", type=int, default=3, help="Ceph OSDs (default 3)")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds until everything is up")
        if not hidden:
            p.add_argument("--build", action="store_true",
                           help="build missing binaries first (hack/build-k8s.sh, with kubectl)")
        p.set_defaults(func=cmd_up if name == "up" else cmd_serve)
    for name, func, text in (("down", cmd_down, "stop everything, undo every host change"),
                             ("status", cmd_status, "what runs")):
        p = sub.add_parser(name, help=text)
        state_arg(p)
        if name == "status":
            p.add_argument("--json", action="store_true", help="machine-readable")
        p.set_defaults(func=func)
    modes = "; ".join(f"{k}: {v}" for k, v in LOSS_MODES.items())
    lose = sub.add_parser("lose-node", help=f"take a node away: {modes}")
    lose.add_argument("node")
    lose.add_argument("--how", choices=list(LOSS_MODES), default="poweroff")
    state_arg(lose)
    lose.set_defaults(func=cmd_node)
    restore = sub.add_parser("restore-node", help="bring a lost node back, wait until Ready")
    restore.add_argument("node")
    state_arg(restore)
    restore.set_defaults(func=cmd_node)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
