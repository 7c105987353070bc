# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run and observe launcher instances on a host (the effects behind ``zjusct.cloud.fc_launcher``).

One launcher instance is one boot of one VM (docs/launcher-protocol.md). Files per VM:

* ``<state>/boot-<N>.json``      the LauncherConfig of boot N (written before the launcher starts)
* ``<state>/spawned-<N>``        written when boot N's launcher was spawned (time, pid)
* ``<state>/ready-<N>``          the launcher's ready marker (SSH banner seen)
* ``<state>/result-<N>.json``    the LauncherResult of boot N (written by the launcher on exit)
* ``<runtime>/launcher.lock``    held (flock) by the launcher and inherited by its VMM for life

Liveness is the lock, read from ``/proc/locks`` without taking it, so observing never races a
launcher that is starting and a recycled pid can never look alive (cases L2, L5 of docs/architecture.md "Failure
cases"). Where systemd is PID 1 the launcher runs as a transient unit (``systemd-run``); elsewhere as a detached session
leader with its output in ``<log_dir>``. Both leave the same files, so observation is the same.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation

SPAWN_GRACE_SECONDS = 20.0
# Capabilities the launcher's transient unit keeps (docs/security.md): ip netns exec (setns, mount: SYS_ADMIN),
# TAP and tc (NET_ADMIN), QEMU -runas / the jailer's drop (SETUID, SETGID), the jail (CHOWN, FOWNER, MKNOD,
# SYS_CHROOT, SYS_RESOURCE for its rlimits), signals to the unprivileged VMM (KILL), root-run access to files
# owned by the VMM's uid (DAC_OVERRIDE). NoNewPrivileges does not stop a root process dropping its own uid.
LAUNCHER_CAPABILITIES = ("CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER",
                         "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_MKNOD", "CAP_SYS_CHROOT", "CAP_SYS_RESOURCE")
_BOOT_FILE = re.compile(r"^boot-(\d+)\.json$")


class LauncherError(CloudError):
    """A launcher could not be validated, started or stopped."""


@dataclass(frozen=True)
class LauncherPaths:
    """Where one VM's launcher files live."""

    state_dir: str
    runtime_dir: str
    log_dir: str
    name: str  # "<namespace>_<name>", used for log file and unit names

    def config(self, boot_id: int) -> str:
        return os.path.join(self.state_dir, f"boot-{boot_id}.json")

    def spawned(self, boot_id: int) -> str:
        return os.path.join(self.state_dir, f"spawned-{boot_id}")

    def ready(self, boot_id: int) -> str:
        return os.path.join(self.state_dir, f"ready-{boot_id}")

    def result(self, boot_id: int) -> str:
        return os.path.join(self.state_dir, f"result-{boot_id}.json")

    @property
    def lock(self) -> str:
        return os.path.join(self.runtime_dir, "launcher.lock")

    @property
    def log(self) -> str:
        return os.path.join(self.log_dir, f"{self.name}.launcher.log")

    @property
    def serial_log(self) -> str:
        return os.path.join(self.log_dir, f"{self.name}.serial.log")


def _lock_ident(path: str) -> Optional[str]:
    """``MAJ:MIN:INODE`` of ``path`` as ``/proc/locks`` writes it (hex device numbers), None if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def _flock_holders(lines: Iterable[str]) -> Iterator[tuple[str, int]]:
    """``(MAJ:MIN:INODE, pid)`` of each granted flock in ``/proc/locks`` lines, in file order."""
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" ("->" marks blocked waiters)
        if "->" in parts:
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK":
            yield parts[5].lower(), int(parts[4])


def lock_holder(path: str) -> Optional[int]:
    """The pid holding a flock on ``path`` according to ``/proc/locks``, else None.

    Reads the kernel's lock table (proc(5), "/proc/locks") by device and inode, so it never takes
    the lock itself. One call reads the whole table; to observe many VMs read it once with
    :func:`lock_table`.
    """
    ident = _lock_ident(path)
    if ident is None:
        return None
    with open("/proc/locks", encoding="ascii") as fh:
        for held, pid in _flock_holders(fh):
            if held == ident:
                return pid
    return None


@dataclass(frozen=True)
class LockTable:
    """One read of ``/proc/locks``: the flock holders by ``MAJ:MIN:INODE`` and when the table was read.

    ``/proc/locks`` has one line per lock on the host, so reading it once per VM costs O(VMs x locks):
    285 s for 10,000 running VMs (bench/inventory_scale.py). Listing reads it once (:func:`lock_table`).
    """

    holders: dict[str, int]
    taken: float  # time.time() when the table was read

    def holder(self, path: str) -> Optional[int]:
        """The pid that held a flock on ``path`` when the table was read, else None (as :func:`lock_holder`)."""
        ident = _lock_ident(path)
        return None if ident is None else self.holders.get(ident)


def lock_table() -> LockTable:
    """Read ``/proc/locks`` once (the first holder of an inode wins, as in :func:`lock_holder`)."""
    holders: dict[str, int] = {}
    taken = time.time()
    with open("/proc/locks", encoding="ascii") as fh:
        for ident, pid in _flock_holders(fh):
            holders.setdefault(ident, pid)
    return LockTable(holders, taken)


def _cmdline_boot(pid: int, state_dir: Optional[str] = None) -> Optional[int]:
    """The bootID in the ``boot-<N>.json`` config argument of process ``pid`` (only one under ``state_dir`` when
    given), or None: gone, another process, or the VMM holding the lock after its launcher died."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        return None
    prefix = os.path.join(state_dir, "").encode() if state_dir else b""
    for arg in args:
        m = re.search(rb"boot-(\d+)\.json$", arg)
        if m and arg.startswith(prefix):
            return int(m.group(1))
    return None


def boots(paths: LauncherPaths) -> list[int]:
    """Boot ids that have a config on disk, ascending."""
    try:
        names = os.listdir(paths.state_dir)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_BOOT_FILE.match, names) if m)


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return None


def running_boot(paths: LauncherPaths, locks: Optional[LockTable] = None) -> Optional[tuple[int, int]]:
    """``(boot_id, pid)`` of the launcher alive for this VM, if any (as of ``locks`` when given, else now)."""
    pid = lock_holder(paths.lock) if locks is None else locks.holder(paths.lock)
    if pid is None:
        return None
    boot = _cmdline_boot(pid)
    return (boot if boot is not None else -1, pid)


def observe(paths: LauncherPaths, boot_id: int, node: Optional[str] = None,
            locks: Optional[LockTable] = None) -> BootObservation:
    """What is there of boot ``boot_id``: alive, starting, exited (with its result) or lost.

    Reads the lock BEFORE the result. The launcher writes its result (temp file, fsync, rename,
    fsync of the directory) before it exits, and only its exit (and its VMM's, reaped before the
    result is written) releases the lock (launcher/zjusct_launcher/runner.py ``run``), so a lock
    seen free means any result is already on disk. Read the other way round, a launcher that
    wrote its result and exited between the two reads would look like one that vanished without
    a result (``lost``, shown as Failed/LauncherLost). A result on disk wins over a held lock: the
    launcher has decided how the boot ended and is only exiting.

    ``locks``, a :func:`lock_table` read before this call, stands for the lock read (listing many
    VMs reads ``/proc/locks`` once); the order above holds since it was read before the result.
    When it shows no holder for a launcher spawned less than :data:`SPAWN_GRACE_SECONDS` before it
    was read, or after, the lock is read again now: that launcher may have taken it since.

    Returns:
        A :class:`BootObservation`; ``lost`` only when the launcher was spawned more than
        :data:`SPAWN_GRACE_SECONDS` ago, no live launcher of this boot held the lock and no result
        was on disk after that.
    """
    spawned = _read_json(paths.spawned(boot_id)) or {}
    started_at = spawned.get("startedAt")
    live = running_boot(paths, locks)  # first: see the docstring
    if locks is not None and live is None and spawned and \
            locks.taken - float(spawned.get("time", 0)) < SPAWN_GRACE_SECONDS:
        live = running_boot(paths)
    result = _read_json(paths.result(boot_id))
    ready_at = (_read_json(paths.ready(boot_id)) or {}).get("readyAt") or (result or {}).get("readyAt")
    if ready_at is None and os.path.exists(paths.ready(boot_id)):
        try:
            ready_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(paths.ready(boot_id))))
        except FileNotFoundError:  # removed by a launcher starting the same boot again
            ready_at = None
    if result is not None:
        return BootObservation(boot_id, "exited", ready_at=ready_at, started_at=started_at, result=result,
                               node=node)
    if live is not None and live[0] == boot_id:
        return BootObservation(boot_id, "alive", ready_at=ready_at, started_at=started_at, node=node)
    if spawned and time.time() - float(spawned.get("time", 0)) < SPAWN_GRACE_SECONDS and live is None:
        return BootObservation(boot_id, "starting", started_at=started_at, node=node)
    if not spawned:
        return BootObservation(boot_id, "starting", node=node, detail="configured, not spawned yet")
    return BootObservation(boot_id, "lost", started_at=started_at, node=node,
                           detail=f"the launcher of boot {boot_id} (pid {spawned.get('pid')}) is gone and left"
                                  " no result (killed or crashed)")


def write_config(paths: LauncherPaths, config: dict) -> bool:
    """Write boot N's LauncherConfig (atomically); returns whether the file changed."""
    os.makedirs(paths.state_dir, mode=0o700, exist_ok=True)
    target = paths.config(int(config["vm"]["bootID"]))
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    try:
        with open(target, encoding="utf-8") as fh:
            if fh.read() == text:
                return False
    except FileNotFoundError:
        pass
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return True


def launcher_env(pythonpath: Optional[str]) -> dict:
    """Environment for launcher processes (PATH plus the launcher package on PYTHONPATH)."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C.UTF-8"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def check_config(command: list[str], config_path: str, env: dict, netns: str = "", timeout: float = 60) -> None:
    """Run ``<launcher> check --config FILE`` (inside ``netns``, where the TAP lives).

    Raises:
        LauncherError: the config was rejected; the message lists every problem the launcher found.
    """
    argv = [*command, "check", "--config", config_path]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherError(f"launcher check could not run: {exc}") from exc
    if proc.returncode != 0:
        raise LauncherError(f"launcher config {config_path} rejected: {(proc.stdout + proc.stderr).strip()}")


def systemd_is_init() -> bool:
    """True when systemd is PID 1 (sd_booted(3): /run/systemd/system exists)."""
    return os.path.isdir("/run/systemd/system")


def _config_paths(config: dict) -> list[str]:
    """Directories and files a launcher run writes, from its LauncherConfig (sorted, unique)."""
    files = [(config.get("rootDisk") or {}).get("path"), config.get("serialLogPath"),
             (config.get("result") or {}).get("path"), (config.get("result") or {}).get("terminationMessagePath"),
             config.get("readyMarkerPath")]
    out = {os.path.dirname(f) for f in files[1:] if f}
    if files[0]:
        out.add(files[0])
    if config.get("runtimeDir"):
        out.add(config["runtimeDir"])
    jail = ((config.get("hypervisor") or {}).get("jailer") or {}).get("chrootBaseDir")
    if jail:
        out.add(jail)
    slots = _boot_slot_dir(config)
    if slots:  # the launcher creates the slot files there
        out.add(slots)
    return sorted(out)


def _boot_slot_dir(config: dict) -> Optional[str]:
    """``bootSlots.directory`` of a LauncherConfig, or None without boot slots."""
    return (config.get("bootSlots") or {}).get("directory")


def hardening_properties(config: dict) -> list[str]:
    """systemd unit properties (``Key=value``) that confine a launcher running ``config``.

    The launcher stays root (it joins the network namespace and the VMM drops to ``hypervisor.runAs`` itself);
    the unit keeps only :data:`LAUNCHER_CAPABILITIES`, sees the file system read-only except the paths the run
    writes (``-`` prefix: a path not there yet is no error), the home directories read-only, and a private
    /tmp unless the config names paths there. Verified with ``systemd-analyze verify`` (tests); systemd is not
    PID 1 on the development machines, so no launcher has run under these properties there.
    """
    writable = _config_paths(config)
    props = ["NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only",
             "ReadWritePaths=" + " ".join(f"-{p}" for p in writable),
             "CapabilityBoundingSet=" + " ".join(LAUNCHER_CAPABILITIES), "RestrictSUIDSGID=yes",
             "LockPersonality=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "ProtectHostname=yes",
             "RestrictRealtime=yes", "SystemCallArchitectures=native"]
    if not any(p == t or p.startswith(t + "/") for p in writable for t in ("/tmp", "/var/tmp")):
        props.append("PrivateTmp=yes")
    return props


def spawn(paths: LauncherPaths, boot_id: int, command: list[str], env: dict, netns: str = "") -> int:
    """Start boot ``boot_id``'s launcher detached; returns its pid (0 under systemd).

    The argv is ``[ip netns exec <netns>] <command> run --config <boot-N.json>``: the launcher,
    its readiness probe and the VMM all live in the cloud's network namespace.
    """
    os.makedirs(paths.log_dir, mode=0o750, exist_ok=True)
    argv = [*command, "run", "--config", paths.config(boot_id)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    if systemd_is_init():
        unit = f"zjusct-launcher-{paths.name}-{boot_id}"
        with open(paths.config(boot_id), encoding="utf-8") as fh:
            config = json.load(fh)
        hardening = hardening_properties(config)
        slots = _boot_slot_dir(config)
        if slots:  # ReadWritePaths= skips a missing path ("-"), and the unit then cannot create it
            os.makedirs(slots, mode=0o755, exist_ok=True)
        sd = ["systemd-run", f"--unit={unit}", "--collect", "--property=KillMode=mixed",
              "--property=TimeoutStopSec=infinity", *[f"--property={p}" for p in hardening],
              *[f"--setenv={k}={v}" for k, v in env.items()], *argv]
        subprocess.run(sd, check=True, capture_output=True, timeout=30)
        pid = 0
    else:
        with open(paths.log, "ab") as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(argv, stdin=devnull, stdout=log, stderr=log, env=env, close_fds=True,
                                    start_new_session=True, cwd="/")
        pid = proc.pid
    record = {"pid": pid, "time": time.time(), "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(paths.spawned(boot_id), "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    return pid


def start(paths: LauncherPaths, config: dict, command: list[str], env: dict, netns: str = "") -> int:
    """Start the boot ``config`` describes: write its config, have the launcher check it, spawn the launcher.

    The one sequence both the cloudvm module (host backend) and fc_launcher use. On any failure the config
    file just written is removed again (a boot-N.json without a spawned-N is "not spawned", see
    :func:`observe`), and the error propagates.

    Args:
        paths: the VM's launcher files; config: a LauncherConfig whose ``vm.bootID`` is the boot to start;
        command, env, netns: as for :func:`check_config` and :func:`spawn`.

    Returns:
        the launcher's pid (0 under systemd), as :func:`spawn`.

    Raises:
        LauncherError: the launcher rejected the config; OSError/subprocess errors from writing or spawning.
    """
    boot = int(config["vm"]["bootID"])
    write_config(paths, config)
    try:
        check_config(command, paths.config(boot), env, netns)
        return spawn(paths, boot, command, env, netns)
    except BaseException:
        os.unlink(paths.config(boot))
        raise


def request_stop(paths: LauncherPaths) -> bool:
    """Send SIGTERM to the live launcher (graceful guest shutdown, then kill after its stop timeout).

    Returns True when a launcher was signalled.
    """
    live = running_boot(paths)
    # /proc/locks names the process that took the flock: once a SIGKILLed launcher's VMM (which inherited the lock)
    # holds it until the watchdog kills it, that pid is gone and may already be another process's (pid_max is
    # 32768 here); only the VM's own launcher, by its config path, is signalled
    if live is None or _cmdline_boot(live[1], paths.state_dir) is None:
        return False
    try:
        os.kill(live[1], signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def wait_gone(paths: LauncherPaths, timeout: float) -> bool:
    """Wait until no launcher (nor its VMM) holds the VM's lock; True when gone within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while lock_holder(paths.lock) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def kill(paths: LauncherPaths) -> None:
    """SIGKILL whatever holds the VM's lock (last resort after a stop timeout)."""
    pid = lock_holder(paths.lock)
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
