"""A real Ceph cluster on this host (mon + mgr + one or more bluestore OSDs), started from an empty directory: the
tests' single-OSD cluster and the local cluster's three OSDs (:class:`~.cluster.LocalCluster`).

Everything lives under one state directory D: ``ceph.conf``, keyrings, mon/mgr/osd data, pid files, admin
sockets, logs and the sparse file backing the OSD. The monitor listens on two free TCP ports of 127.0.0.1
(msgr2 and msgr1) chosen at start; mgr and OSD bind ephemeral ports on 127.0.0.1. ``address`` replaces 127.0.0.1
by another address of this host (one that Pods can route to, e.g. the host side of the Pods' bridge; it must
exist before the start). Nothing is written to /etc/ceph or /var/lib/ceph. Shape and gotchas are measured in
``shared/recipes/ceph.md``.

With ``osds`` > 1 every pool keeps ``min(osds, 3)`` replicas, one per OSD (CRUSH failure domain ``osd``: all OSDs
are on this one host), ``min_size`` 1. ``client_dir()`` writes a minimal client configuration (fsid, mon_host,
cephx) and the admin keyring under the names Ceph clients look for by default (``ceph.conf``,
``ceph.client.admin.keyring``), for a Pod that mounts the directory at ``/etc/ceph``.

Public API:
    start_cluster(base=None, timeout=120.0, address="127.0.0.1", osds=1) -> Cluster
                                                            start, wait for all PGs active+clean, pool ``rbd``
    stop_cluster(state_dir)                                stop daemons by pid and remove the directory
    Cluster                                                 conf path, keyring path, env(), stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("mon.a", "mgr.x", "osd.0")  # the single-OSD cluster's; stop_cluster reads every pid file
STATE_MARK = "zjusct-test-ceph"  # file in D that marks a directory created by this tool (for safe removal)


class CephClusterError(RuntimeError):
    """Bootstrap failed; the message names the step and, when useful, the tail of the daemon log."""


@dataclass
class Cluster:
    """A running test cluster.

    Attributes:
        state_dir: the directory holding everything (removed by ``stop``).
        conf: path of ``ceph.conf`` (pass as ``CEPH_CONF`` or ``-c``).
        keyring: path of the client.admin keyring.
        fsid: the cluster fsid.
        mon_ports: (msgr2 port, msgr1 port) on ``address``.
        address: the IPv4 address every daemon binds (default 127.0.0.1).
        bootstrap_seconds: wall time from empty directory to all PGs active+clean.
        osds: how many OSDs run (ids 0..osds-1).
    """

    state_dir: Path
    conf: Path
    keyring: Path
    fsid: str
    mon_ports: tuple[int, int]
    bootstrap_seconds: float = 0.0
    pool: str = "rbd"
    address: str = "127.0.0.1"
    osds: int = 1
    _stopped: bool = field(default=False, repr=False)

    @property
    def mon_host(self) -> str:
        """The monitor's address vector as ``mon_host`` takes it: ``[v2:ADDR:P2/0,v1:ADDR:P1/0]``."""
        return f"[v2:{self.address}:{self.mon_ports[0]}/0,v1:{self.address}:{self.mon_ports[1]}/0]"

    def env(self) -> dict[str, str]:
        """Environment for child processes that must reach this cluster (CEPH_CONF + LC_ALL=C)."""
        env = dict(os.environ)
        env["CEPH_CONF"] = str(self.conf)
        env["LC_ALL"] = "C"
        return env

    def ceph(self, *args: str, timeout: float = 30.0) -> str:
        """Run ``ceph <args>`` against this cluster and return stdout; raises CephClusterError on failure."""
        return _run(["ceph", "-c", str(self.conf), *args], timeout=timeout)

    def client_dir(self) -> Path:
        """Write (once) and return ``<state_dir>/client`` with ``ceph.conf`` (fsid, mon_host, cephx; nothing that
        writes to the state dir) and ``ceph.client.admin.keyring``: mounted at ``/etc/ceph`` a client needs no
        ``-c``/``--keyring``. The directory is mode 0700 (the keyring is the admin's)."""
        out = self.state_dir / "client"
        if not (out / "ceph.conf").exists():
            out.mkdir(mode=0o700, exist_ok=True)
            (out / "ceph.client.admin.keyring").write_bytes(self.keyring.read_bytes())
            (out / "ceph.client.admin.keyring").chmod(0o600)
            (out / "ceph.conf").write_text(
                f"[global]\nfsid = {self.fsid}\nmon_host = {self.mon_host}\nauth_cluster_required = cephx\n"
                "auth_service_required = cephx\nauth_client_required = cephx\n"
                "keyring = /etc/ceph/ceph.client.admin.keyring\n")
        return out

    def stop(self) -> None:
        """Stop all daemons (SIGTERM, then SIGKILL after 15 s) and remove the state directory. Idempotent."""
        if self._stopped:
            return
        stop_cluster(self.state_dir)
        self._stopped = True


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], timeout: float = 30.0, stdin: str | None = None) -> str:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise CephClusterError(f"{cmd[0]} {' '.join(cmd[1:4])}...: timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise CephClusterError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def _conf_text(d: Path, fsid: str, v2: int, v1: int, address: str = "127.0.0.1", osds: int = 1) -> str:
    network = "127.0.0.0/8" if address.startswith("127.") else f"{address}/32"
    size = min(osds, 3)
    return f"""[global]
fsid = {fsid}
mon_host = [v2:{address}:{v2}/0,v1:{address}:{v1}/0]
mon_initial_members = a
public_addr = {address}
public_network = {network}
ms_bind_ipv4 = true
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = {d}/run
admin_socket = {d}/run/$cluster-$name.asok
pid_file = {d}/run/$name.pid
log_file = {d}/log/$name.log
mon_cluster_log_file = {d}/log/cluster.log
crash_dir = {d}/crash
keyring = {d}/ceph.client.admin.keyring
mon_data = {d}/mon/$name
mgr_data = {d}/mgr/$name
osd_data = {d}/osd/$name
osd_pool_default_size = {size}
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
osd_crush_chooseleaf_type = 0
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 2
mon_data_avail_crit = 1
paxos_propose_interval = 0.05
# An idle test cluster's periodic work, halved (mon + mgr + OSD 1.4 % -> 0.6 % of a core, same-run pair on the
# 2-core machine, 2026-12-03; a lane keeps its cluster the whole session): OSD and PG stats to the mgr and the
# mgr's digest to the mon every 30 s instead of 5 (the bootstrap, to all PGs active+clean, still took 5.2 s; 5.0
# before), the mgr's tick and beacon every 10 s instead of 2 (the mon's beacon grace is 30 s).
mgr_stats_period = 30
mon_mgr_digest_period = 30
mon_osd_reporter_subtree_level = osd
auth_allow_insecure_global_id_reclaim = false
mon_warn_on_insecure_global_id_reclaim_allowed = false

[mon]
mon_keyring = {d}/mon.keyring

[mgr]
keyring = {d}/mgr/$name/keyring
mgr_disabled_modules = dashboard
mgr_initial_modules = iostat
mgr_tick_period = 10

[osd]
keyring = {d}/osd/$name/keyring
osd_objectstore = bluestore
bluestore_block_path = {d}/osd-$id.block
bluestore_block_size = 10737418240
bluestore_block_create = true
bluestore_fsck_on_mkfs = false
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
# the OSD's mempool thread trims its caches every 1 s, not every 50 ms
bluestore_cache_trim_interval = 1
osd_max_object_name_len = 460
osd_max_object_namespace_len = 64

[client]
admin_socket = {d}/run/$cluster-$name.$pid.asok
log_file = {d}/log/client.$pid.log
"""


def _wait_pidfile(path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError):
            text = path.read_text().strip()
            if text:
                return int(text)
        time.sleep(0.05)
    raise CephClusterError(f"{path.name} did not appear within {timeout:.0f} s")


def _log_tail(d: Path, name: str) -> str:
    log = d / "log" / f"{name}.log"
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return "(no log)"


def _poll(what: str, check: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except CephClusterError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise CephClusterError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def _start(d: Path, timeout: float, address: str = "127.0.0.1", osds: int = 1) -> Cluster:
    t0 = time.monotonic()
    fsid = str(uuid.uuid4())
    v2, v1 = _free_port(address), _free_port(address)
    while v1 == v2:
        v1 = _free_port(address)
    for sub in ("run", "log", "crash", "mon/mon.a", "mgr/mgr.x", *(f"osd/osd.{i}" for i in range(osds))):
        (d / sub).mkdir(parents=True, exist_ok=True)
    conf = d / "ceph.conf"
    conf.write_text(_conf_text(d, fsid, v2, v1, address, osds))
    c = str(conf)
    admin = d / "ceph.client.admin.keyring"
    monkr = d / "mon.keyring"
    _run(["ceph-authtool", "--create-keyring", str(monkr), "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"])
    _run(["ceph-authtool", "--create-keyring", str(admin), "--gen-key", "-n", "client.admin",
          "--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *", "--cap", "mds", "allow *"])
    _run(["ceph-authtool", str(monkr), "--import-keyring", str(admin)])
    os.chmod(admin, 0o600)
    monmap = d / "monmap"
    _run(["monmaptool", "--create", "--fsid", fsid, "--addv", "a", f"[v2:{address}:{v2},v1:{address}:{v1}]",
          str(monmap)])
    _run(["ceph-mon", "-c", c, "--mkfs", "-i", "a", "--monmap", str(monmap), "--keyring", str(monkr)], timeout=60)
    _run(["ceph-mon", "-c", c, "-i", "a"], timeout=60)
    _wait_pidfile(d / "run" / "mon.a.pid", 30)
    cluster = Cluster(state_dir=d, conf=conf, keyring=admin, fsid=fsid, mon_ports=(v2, v1), address=address,
                      osds=osds)
    _poll("mon quorum", lambda: json.loads(cluster.ceph("quorum_status", "--format", "json", timeout=10))
          .get("quorum_names"), timeout)

    mgr_kr = d / "mgr" / "mgr.x" / "keyring"
    mgr_kr.write_text(cluster.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *",
                                   "mds", "allow *"))
    _run(["ceph-mgr", "-c", c, "-i", "x"], timeout=60)
    _wait_pidfile(d / "run" / "mgr.x.pid", 30)

    mkfs = []
    for i in range(osds):
        osd_uuid = str(uuid.uuid4())
        secret = _run(["ceph-authtool", "--gen-print-key"]).strip()
        osd_id = _run(
            ["ceph", "-c", c, "osd", "new", osd_uuid, "-i", "-"], stdin=json.dumps({"cephx_secret": secret}),
            timeout=30).strip()
        if osd_id != str(i):
            raise CephClusterError(f"ceph osd new returned id {osd_id!r}, expected {i}")
        osd_kr = d / "osd" / f"osd.{i}" / "keyring"
        _run(["ceph-authtool", "--create-keyring", str(osd_kr), "--name", f"osd.{i}", "--add-key", secret])
        mkfs.append(["ceph-osd", "-c", c, "-i", str(i), "--mkfs", "--osd-uuid", osd_uuid])
    _run_all(mkfs, timeout=180)  # the OSDs' mkfs side by side: each is mostly waiting on its block file
    for i in range(osds):
        _run(["ceph-osd", "-c", c, "-i", str(i)], timeout=60)
    for i in range(osds):
        _wait_pidfile(d / "run" / f"osd.{i}.pid", 30)
    _poll(f"{osds} OSD(s) up and in", lambda: json.loads(cluster.ceph("osd", "stat", "--format", "json", timeout=10))
          .get("num_up_osds") == osds, timeout)

    cluster.ceph("osd", "pool", "create", "rbd", "8", "8", timeout=60)
    _run(["rbd", "-c", c, "pool", "init", "rbd"], timeout=60)
    _poll("all PGs active+clean", lambda: _all_clean(cluster), timeout)
    cluster.bootstrap_seconds = time.monotonic() - t0
    return cluster


def _run_all(cmds: list[list[str]], timeout: float) -> None:
    """Run ``cmds`` at the same time; raise CephClusterError naming the first that failed or timed out."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for cmd in cmds]
    deadline = time.monotonic() + timeout
    failed = None
    for cmd, proc in zip(cmds, procs, strict=True):
        try:
            _out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed = failed or f"{' '.join(cmd[:6])}...: timed out after {timeout:.0f} s"
            continue
        if proc.returncode != 0:
            failed = failed or f"{' '.join(cmd)}: exit {proc.returncode}: {err.strip()[-2000:]}"
    if failed:
        raise CephClusterError(failed)


def _all_clean(cluster: Cluster) -> bool:
    stat = json.loads(cluster.ceph("pg", "stat", "--format", "json", timeout=10))
    summary = stat.get("pg_summary", stat)
    total = summary.get("num_pgs", 0)
    states = summary.get("num_pg_by_state", [])
    clean = sum(s["num"] for s in states if s.get("name") == "active+clean")
    return total > 0 and clean == total


def start_cluster(base: str | os.PathLike[str] | None = None, timeout: float = 120.0,
                  address: str = "127.0.0.1", osds: int = 1) -> Cluster:
    """Bootstrap a fresh cluster on this host in a new temporary directory and wait until it is settled.

    Args:
        base: parent directory for the state directory (default: ``$TMPDIR``). Short paths are better: admin
            socket paths must stay under 107 bytes.
        timeout: seconds allowed for each wait (quorum, OSD up, PGs clean).
        address: IPv4 address of this host that mon, mgr and OSD bind (default 127.0.0.1, reachable only from
            this network namespace); it must exist before the call.
        osds: how many OSDs (1..8; each is a 10 GiB sparse block file and about 100-200 MB of memory).

    Returns:
        a running ``Cluster`` with pool ``rbd`` initialised and every PG active+clean.

    Raises:
        CephClusterError: a step failed or timed out. Every daemon started so far is stopped and the directory
            removed before the exception propagates.
        ValueError: ``osds`` is outside 1..8.
    """
    if not 1 <= osds <= 8:
        raise ValueError(f"osds={osds}: must be 1..8")
    d = Path(tempfile.mkdtemp(prefix="zceph-", dir=base))
    (d / STATE_MARK).write_text(str(os.getpid()))
    try:
        return _start(d, timeout, address, osds)
    except BaseException as exc:
        tails = "\n".join(f"--- {n} ---\n{_log_tail(d, n)}" for n in (*DAEMONS[:2], *(f"osd.{i}" for i in range(osds))))
        stop_cluster(d)
        if isinstance(exc, CephClusterError):
            raise CephClusterError(f"{exc}\n{tails}") from exc
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _pid_is_ours(pid: int, d: Path) -> bool:
    """True when /proc/pid/cmdline shows a ceph daemon started with this state dir's conf (guards pid reuse)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(d / "ceph.conf").encode() in cmd


def stop_cluster(state_dir: str | os.PathLike[str]) -> list[str]:
    """Stop the daemons of a test cluster by the pids in its pid files, then remove the directory.

    SIGTERM each daemon (OSD first, mon last), wait up to 15 s, then SIGKILL. Only pids whose command line
    names this directory's ceph.conf are signalled. The directory is removed only if it carries the mark file
    written by ``start_cluster``.

    Returns:
        names of daemons that had to be killed with SIGKILL (normally empty).
    """
    d = Path(state_dir)
    killed: list[str] = []
    pids: list[tuple[str, int]] = []
    names = sorted((p.name[:-4] for p in (d / "run").glob("*.pid")), key=lambda n: ("osd" not in n, "mgr" not in n))
    for name in names:  # OSDs first, the monitor last
        with contextlib.suppress(OSError, ValueError):
            pid = int((d / "run" / f"{name}.pid").read_text().strip())
            if _pid_alive(pid) and _pid_is_ours(pid, d):
                pids.append((name, pid))
    for _name, pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_pid_alive(p) for _, p in pids):
        time.sleep(0.05)
    for name, pid in pids:
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(name)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_pid_alive(p) for _, p in pids):
        time.sleep(0.05)
    if (d / STATE_MARK).exists():
        shutil.rmtree(d, ignore_errors=True)
    return killed
