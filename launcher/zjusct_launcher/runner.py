"""The run state machine: validate -> lock -> prepare -> start VMM -> readiness -> wait -> stop -> result.

Effects live here; decisions are in :mod:`config`, :mod:`decide`, :mod:`qemu`, :mod:`firecracker`,
:mod:`identity`. The result is written on every exit path except AlreadyRunning (another launcher owns it) and a
config file that cannot be read as JSON at all (no result path is known then).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from zjusct_launcher import config as cfgmod
from zjusct_launcher import environment, firecracker, firecracker_api, identity, kvm, lock, log, qemu, readiness, tap
from zjusct_launcher.decide import Facts, decide, exit_status
from zjusct_launcher.fs import publish, write_atomic
from zjusct_launcher.paths import RuntimePaths
from zjusct_launcher.qmp import QmpClient, QmpError
from zjusct_launcher.result import EXIT_ALREADY_RUNNING, Result

PR_SET_PDEATHSIG = 1  # linux/prctl.h
QMP_CONNECT_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 1.0
BOOT_SLOT_POLL_SECONDS = 0.2  # how often a launcher waiting for a boot slot tries the slots again
GRACEFUL_RETRY_SECONDS = 0.05  # Firecracker API not listening yet at a stop: try SendCtrlAltDel again this often
PANIC_MARKER = b"Kernel panic - not syncing"
WATCHDOG_EXIT_SECONDS = 5.0
# The VMM watchdog (a separate process, started before the VMM). A VMM that changes credentials (QEMU -runas, the
# Firecracker jailer) loses PR_SET_PDEATHSIG (prctl(2): cleared when the effective uid/gid changes; measured with
# QEMU 7.2), so it would outlive a SIGKILLed launcher. The watchdog receives a pidfd of the VMM over a socketpair
# (SCM_RIGHTS) and kills it when the launcher's end closes: at the launcher's death, or after its cleanup, when
# the pidfd's process is already gone (a pidfd never signals a recycled pid).
WATCHDOG = """
import signal, socket, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
sock = socket.socket(fileno=0)
try:
    _msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
except OSError:
    sys.exit(0)
if not fds:
    sys.exit(0)
try:
    while sock.recv(16):
        pass
except OSError:
    pass
try:
    signal.pidfd_send_signal(fds[0], signal.SIGKILL)
except (ProcessLookupError, OSError):
    pass
"""


class _Fail(Exception):
    """Ends the run early with a reason (HypervisorMissing, LauncherError...)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _vm_json(doc: Any) -> dict[str, Any]:
    vm = doc.get("vm") if isinstance(doc, dict) else None
    return vm if isinstance(vm, dict) else {}


def _result_paths(doc: Any) -> tuple[str | None, str | None]:
    """Best-effort result paths from an invalid document (only absolute string paths are used)."""
    res = doc.get("result") if isinstance(doc, dict) else None
    if not isinstance(res, dict):
        return None, None
    path, term = res.get("path"), res.get("terminationMessagePath")
    ok = [p if isinstance(p, str) and p.startswith("/") else None for p in (path, term)]
    return ok[0], ok[1]


def run_file(config_path: str) -> int:
    """``zjusct-launcher run --config FILE``. Returns the process exit code."""
    started = time.time()
    runner = Runner(started)
    try:
        with open(config_path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError) as exc:
        log.error("config unreadable; no result path known, nothing written", config=config_path, error=str(exc))
        return 2
    try:
        cfg = cfgmod.parse(doc)
        problems = environment.environment_problems(cfg)
    except cfgmod.ConfigError as exc:
        problems = exc.problems
    if problems:
        for p in problems:
            log.error("config invalid", problem=p)
        path, term = _result_paths(doc)
        vm = _vm_json(doc)
        boot_id = vm.get("bootID") if isinstance(vm.get("bootID"), int) else 0
        res = Result(vm=vm, boot_id=boot_id, reason="ConfigInvalid", started_at=log.rfc3339(started),
                     finished_at=log.rfc3339(), message="; ".join(problems))
        for err in publish(res, path, term):
            log.error("cannot write result", error=err)
        return res.exit_code
    return runner.run(cfg)


class Runner:
    def __init__(self, started: float):
        self.started = started
        self.stop_requested = False
        self.stop_signal: str | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.qmp: QmpClient | None = None
        self.tap_created: str | None = None
        self.jail_dir: str | None = None  # <chrootBaseDir>/<exec name>/<id>, removed at exit
        self.jail_rootfs_owner: tuple[str, int, int] | None = None  # (path, uid, gid) to restore at exit
        self.jail_run_fd: int | None = None  # O_PATH fd of <jail>/root/run: a short API socket path
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.watchdog_sock: socket.socket | None = None
        self.ready_at: str | None = None
        self.readiness_timed_out = False
        self.killed_after_timeout = False
        self.graceful_attempts = 0  # graceful stop attempts in this run (each sent one is logged with its number)
        self.shutdown_reason: str | None = None
        self.guest_panicked = False
        self.serial_offset = 0
        self.vmm_stderr: deque[str] = deque(maxlen=20)
        self.boot_slot_fd: int | None = None
        self.boot_slot_since = 0.0
        self._ready_stop = threading.Event()
        self._ready_outcome: list[bytes | None] = []

    # -- signals ---------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_requested = True
        self.stop_signal = signal.Signals(signum).name
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass

    # -- top level -------------------------------------------------------------------------------------
    def run(self, cfg: cfgmod.LauncherConfig) -> int:
        self.cfg = cfg
        self.paths = RuntimePaths(cfg.runtime_dir)
        try:
            os.makedirs(cfg.runtime_dir, mode=0o700, exist_ok=True)
            os.chmod(cfg.runtime_dir, 0o700)
            self.lock_fd = lock.acquire(self.paths.lock)
        except lock.AlreadyRunning:
            log.error("another launcher holds the runtimeDir lock; leaving its result alone",
                      lock=self.paths.lock, reason="AlreadyRunning")
            return EXIT_ALREADY_RUNNING
        except OSError as exc:
            return self._finish("LauncherError", f"runtimeDir {cfg.runtime_dir}: {exc}", None)
        status: int | None = None
        try:
            reason, message, status = self._run_locked()
        except _Fail as exc:
            reason, message = exc.reason, exc.message
        except Exception as exc:  # the launcher's own bug or an unexpected OS error: still write a result
            log.error("launcher error", error=repr(exc), traceback=traceback.format_exc())
            reason, message = "LauncherError", f"launcher error: {exc!r}"
        finally:
            status = self._cleanup(status)
        # Order the supervisor relies on (plugins/module_utils/host/supervisor.py observe): the VMM is reaped in
        # _cleanup, the result is written and fsynced in _finish, and only then does the process exit and the
        # kernel release the lock (self.lock_fd is never closed before). A lock seen free implies a result on disk.
        return self._finish(reason, message, status)

    def _finish(self, reason: str, message: str, status: int | None) -> int:
        res = Result(vm=self.cfg.vm.as_json(), boot_id=self.cfg.vm.boot_id, reason=reason,
                     started_at=log.rfc3339(self.started), finished_at=log.rfc3339(), message=message,
                     hypervisor_exit_status=status, ready_at=self.ready_at)
        for err in publish(res, self.cfg.result_path, self.cfg.termination_message_path):
            log.error("cannot write result", error=err)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        log.info("launcher finished", reason=reason, exitCode=res.exit_code, message=message,
                 cpuSeconds=round(usage.ru_utime + usage.ru_stime, 3), maxRssKiB=usage.ru_maxrss)
        return res.exit_code

    # -- the run ---------------------------------------------------------------------------------------
    def _run_locked(self) -> tuple[str, str, int | None]:
        cfg, paths = self.cfg, self.paths
        for stale in (*paths.transient(), cfg.ready_marker_path):
            _unlink(stale)
        write_atomic(paths.launcher_pid, f"{os.getpid()}\n".encode())
        log.info("launcher started", vm=f"{cfg.vm.namespace}/{cfg.vm.name}", bootID=cfg.vm.boot_id,
                 hypervisor=cfg.hypervisor.type, runtimeDir=cfg.runtime_dir)
        if self.stop_requested:
            return "StopRequested", f"{self.stop_signal} before the VMM started; nothing was started", None
        binary = self._resolve_binary()
        jailer = self._resolve_jailer()
        accel = self._decide_accel(binary)
        if not self._take_boot_slot():
            return "StopRequested", f"{self.stop_signal} while waiting for a boot slot; nothing was started", None
        self._prepare()
        if jailer is not None:
            self._prepare_jail(binary)
        if self.stop_requested:
            return "StopRequested", f"{self.stop_signal} before the VMM started; nothing was started", None
        self._start_vmm(binary, accel, jailer)
        return self._supervise()

    def _resolve_binary(self) -> str:
        hyp = self.cfg.hypervisor
        default = qemu.DEFAULT_BINARY if hyp.type == "qemu" else firecracker.DEFAULT_BINARY
        if hyp.binary:
            if os.path.isfile(hyp.binary) and os.access(hyp.binary, os.X_OK):
                return hyp.binary
            raise _Fail("HypervisorMissing", f"hypervisor.binary: {hyp.binary} is not an executable file")
        found = shutil.which(default)
        if not found:
            raise _Fail("HypervisorMissing", f"{default} not found in PATH ({os.environ.get('PATH', '')}); "
                                             "install it or set hypervisor.binary")
        return found

    def _resolve_jailer(self) -> str | None:
        jail = self.cfg.hypervisor.jailer
        if self.cfg.hypervisor.type != "firecracker" or jail is None:
            return None
        if jail.binary:
            if os.path.isfile(jail.binary) and os.access(jail.binary, os.X_OK):
                return jail.binary
            raise _Fail("HypervisorMissing", f"hypervisor.jailer.binary: {jail.binary} is not an executable file")
        found = shutil.which("jailer")
        if not found:
            raise _Fail("HypervisorMissing", f"jailer not found in PATH ({os.environ.get('PATH', '')}); "
                                             "install it or set hypervisor.jailer.binary")
        return found

    def _decide_accel(self, binary: str) -> str:
        hyp = self.cfg.hypervisor
        if hyp.type == "qemu" and hyp.accel == "tcg":
            return "tcg"
        if hyp.type == "qemu":
            verdict = kvm.probe(binary, hyp.kvm_probe_timeout_seconds, kernel=self.cfg.boot.kernel or None)
        else:
            ok, detail = kvm.kvm_device_usable()
            qemu_bin = shutil.which(qemu.DEFAULT_BINARY)
            verdict = kvm.probe(qemu_bin, hyp.kvm_probe_timeout_seconds) if ok and qemu_bin else \
                kvm.KvmVerdict(ok, detail, 0.0)
        log.info("kvm probe", usable=verdict.usable, detail=verdict.detail, seconds=round(verdict.seconds, 3))
        if verdict.usable:
            return "kvm"
        if hyp.type == "qemu" and hyp.accel == "auto" and hyp.allow_tcg:
            return "tcg"
        raise _Fail("HypervisorMissing", f"KVM is not usable ({verdict.detail}) and "
                    + ("firecracker needs KVM" if hyp.type == "firecracker" else
                       "TCG is not allowed" if hyp.accel == "auto" else "hypervisor.accel is kvm"))

    def _take_boot_slot(self) -> bool:
        """Wait for one of the host's boot slots (config ``bootSlots``; none configured: no wait).

        The slot is held from here until the guest is ready, its readiness times out, or the run ends (see
        :meth:`_release_boot_slot`), so at most ``bootSlots.count`` guests of the host boot at once; the
        readiness timeout counts from the VMM's start, after the wait. Returns False when a stop signal arrived
        while waiting. Raises _Fail(LauncherError) when the slot directory cannot be used.
        """
        slots = self.cfg.boot_slots
        if slots is None:
            return True
        began = time.monotonic()
        announced = False
        while True:
            if self.stop_requested:
                return False
            try:
                got = lock.try_boot_slot(slots.directory, slots.count)
            except OSError as exc:
                raise _Fail("LauncherError", f"bootSlots.directory {slots.directory}: {exc}") from None
            if got is not None:
                self.boot_slot_fd, index = got
                self.boot_slot_since = time.monotonic()
                log.info("boot slot acquired", slot=index, count=slots.count,
                         waitedSeconds=round(self.boot_slot_since - began, 3))
                return True
            if not announced:
                log.info("waiting for a boot slot", directory=slots.directory, count=slots.count)
                announced = True
            readable, _unused, _unused = select.select([self._wake_r], [], [], BOOT_SLOT_POLL_SECONDS)
            if readable:
                self._drain(self._wake_r)

    def _release_boot_slot(self, cause: str) -> None:
        """Free the boot slot (close its fd) if this launcher holds one; ``cause`` goes into the log line."""
        if self.boot_slot_fd is None:
            return
        os.close(self.boot_slot_fd)
        self.boot_slot_fd = None
        log.info("boot slot released", cause=cause, heldSeconds=round(time.monotonic() - self.boot_slot_since, 3))

    def _prepare(self) -> None:
        cfg, paths = self.cfg, self.paths
        fd = os.open(paths.identity_disk, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(identity.build(cfg))
        rbd = cfg.root_disk.rbd
        if rbd is not None and rbd.keyring_path:
            try:
                with open(rbd.keyring_path, encoding="utf-8") as fh:
                    key = qemu.keyring_key(fh.read(), rbd.user)
            except (OSError, ValueError) as exc:
                raise _Fail("LauncherError", f"rootDisk.rbd.keyringPath {rbd.keyring_path}: {exc}") from None
            fd = os.open(paths.rbd_secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(key)
        if cfg.hypervisor.type == "firecracker" and cfg.hypervisor.jailer is None:
            write_atomic(paths.fc_config, json.dumps(firecracker.build_config(cfg, paths), indent=2).encode(),
                         mode=0o600)
        os.makedirs(os.path.dirname(cfg.serial_log_path), mode=0o755, exist_ok=True)
        try:
            self.serial_offset = os.path.getsize(cfg.serial_log_path)
        except OSError:
            self.serial_offset = 0
        if cfg.network.mode == "tap" and cfg.network.create_tap:
            try:
                run_as = cfg.hypervisor.run_as
                tap.create(cfg.network.tap or "", cfg.network.bridge,
                           (run_as.uid, run_as.gid) if run_as is not None else None)
            except tap.TapError as exc:
                raise _Fail("LauncherError", str(exc)) from None
            self.tap_created = cfg.network.tap
            log.info("tap created", tap=cfg.network.tap, bridge=cfg.network.bridge)

    def _prepare_jail(self, binary: str) -> None:
        """Lay out the jailer's chroot: read-only copies of kernel, initrd, config disk and config file owned by
        runAs, the root disk hard-linked (same inode) and chowned to runAs for the run (restored at exit)."""
        cfg = self.cfg
        run_as = cfg.hypervisor.run_as
        assert run_as is not None and cfg.root_disk.path is not None
        root = firecracker.jail_root(cfg, binary)
        jail_dir = os.path.dirname(root)
        if os.path.lexists(jail_dir):  # a leftover of a killed launcher of this VM (we hold its lock)
            shutil.rmtree(jail_dir)
        try:
            os.makedirs(root, mode=0o700)
        except OSError as exc:
            message = f"hypervisor.jailer.chrootBaseDir: cannot create {root}: {exc.strerror}"
            raise _Fail("LauncherError", message) from None
        self.jail_dir = jail_dir
        os.chown(root, run_as.uid, run_as.gid)

        def place(src: str, inner: str) -> None:
            dst = root + inner
            shutil.copyfile(src, dst)
            os.chown(dst, run_as.uid, run_as.gid)
            os.chmod(dst, 0o400)

        place(cfg.boot.kernel, firecracker.JAIL_KERNEL)
        if cfg.boot.initrd:
            place(cfg.boot.initrd, firecracker.JAIL_INITRD)
        place(self.paths.identity_disk, firecracker.JAIL_IDENTITY)
        doc = json.dumps(firecracker.build_config(cfg, self.paths, jailed=True), indent=2).encode()
        write_atomic(root + firecracker.JAIL_CONFIG, doc, mode=0o400)
        os.chown(root + firecracker.JAIL_CONFIG, run_as.uid, run_as.gid)
        disk = cfg.root_disk.path
        try:
            os.link(disk, root + firecracker.JAIL_ROOTFS)
        except OSError as exc:
            raise _Fail("LauncherError", f"rootDisk.path {disk}: cannot hard-link it into the jail {root} "
                        f"({exc.strerror}); hypervisor.jailer.chrootBaseDir must be on the root disk's "
                        "filesystem") from None
        st = os.stat(disk)
        self.jail_rootfs_owner = (disk, st.st_uid, st.st_gid)
        os.chown(disk, run_as.uid, run_as.gid)
        os.makedirs(root + "/run", mode=0o700)
        os.chown(root + "/run", run_as.uid, run_as.gid)
        self.jail_run_fd = os.open(root + "/run", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        log.info("jail prepared", root=root, uid=run_as.uid, gid=run_as.gid)

    @property
    def fc_api_socket(self) -> str:
        """The Firecracker API socket: in runtimeDir, or (jailed) through /proc/self/fd of the jail's /run,
        which keeps the path under the 107 bytes of sun_path whatever chrootBaseDir is."""
        if self.jail_run_fd is not None:
            return f"/proc/self/fd/{self.jail_run_fd}/{os.path.basename(firecracker.JAIL_API_SOCKET)}"
        return self.paths.fc_socket

    def _start_vmm(self, binary: str, accel: str, jailer: str | None = None) -> None:
        cfg, paths = self.cfg, self.paths
        if cfg.hypervisor.type == "qemu":
            root = cfg.root_disk.path
            is_blk = root is not None and stat.S_ISBLK(os.stat(root).st_mode)
            argv = qemu.build_argv(cfg, binary, accel, paths, is_blk)
            stdout: Any = subprocess.DEVNULL
        else:
            argv = firecracker.build_jailer_argv(cfg, jailer, binary) if jailer else \
                firecracker.build_argv(cfg, binary, paths)
            stdout = open(cfg.serial_log_path, "ab")
        parent = os.getpid()
        libc = ctypes.CDLL(None, use_errno=True)
        lock_fd = self.lock_fd

        def child_setup() -> None:  # runs in the child between fork and exec
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(127)

        cpu = _cpu_seconds()
        if cfg.hypervisor.run_as is not None:
            self._start_watchdog()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                                         pass_fds=(lock_fd,), start_new_session=True, preexec_fn=child_setup)
        except OSError as exc:
            raise _Fail("HypervisorMissing", f"cannot start {binary}: {exc.strerror}") from None
        finally:
            if stdout is not subprocess.DEVNULL:
                stdout.close()
        write_atomic(paths.vmm_pid, f"{self.proc.pid}\n".encode())
        try:
            self.pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        if self.watchdog_sock is not None:
            if self.pidfd is None:
                raise _Fail("LauncherError", "pidfd_open failed: the VMM watchdog cannot be armed (Linux >= 5.3 "
                                             "is needed with hypervisor.runAs)")
            socket.send_fds(self.watchdog_sock, [b"p"], [self.pidfd])
        log.info("vmm started", pid=self.proc.pid, accel=accel, argv=argv, launcherCpuSecondsBeforeVmm=round(cpu, 4),
                 launcherMaxRssKiB=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        threading.Thread(target=self._relay_stderr, name="vmm-stderr", daemon=True).start()

    def _start_watchdog(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.set_inheritable(False)
        try:
            self.watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=theirs.fileno(),
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            ours.close()
            raise _Fail("LauncherError", f"cannot start the VMM watchdog: {exc.strerror}") from None
        finally:
            theirs.close()
        self.watchdog_sock = ours

    def _stop_watchdog(self) -> None:
        """After the VMM is reaped: close our end (the watchdog's pidfd then names a dead process) and reap it."""
        if self.watchdog_sock is not None:
            self.watchdog_sock.close()
            self.watchdog_sock = None
        if self.watchdog is not None:
            try:
                self.watchdog.wait(WATCHDOG_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
            self.watchdog = None

    def _relay_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.vmm_stderr.append(line)
                log.log("warning", "vmm stderr", line=line)

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _supervise(self) -> tuple[str, str, int | None]:
        cfg = self.cfg
        assert self.proc is not None
        if cfg.hypervisor.type == "qemu":
            try:
                self.qmp = QmpClient.connect(self.paths.qmp_socket, QMP_CONNECT_TIMEOUT_SECONDS, self._alive)
            except QmpError as exc:
                log.warning("no QMP connection; a stop will end in a kill", error=str(exc))
        ready_r, ready_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if cfg.readiness is not None:
            threading.Thread(target=self._readiness, args=(ready_w,), name="readiness", daemon=True).start()
        else:
            self._mark_ready(None)
        stop_deadline: float | None = None
        next_graceful: float | None = None  # when to (re)send the graceful stop request; None: not (any more)
        try:
            while True:
                if (self.stop_requested or self.readiness_timed_out) and stop_deadline is None:
                    stop_deadline = time.monotonic() + cfg.stop_timeout_seconds
                    next_graceful = time.monotonic()
                if self.shutdown_reason is not None:
                    next_graceful = None  # QEMU's SHUTDOWN event: the guest is going; nothing to repeat
                now = time.monotonic()
                if next_graceful is not None and stop_deadline is not None and next_graceful <= now < stop_deadline \
                        and self.proc.poll() is None:
                    next_graceful = self._graceful_stop()
                    if self.qmp is not None:  # events that arrived with the command's reply
                        self._handle_events(self.qmp.poll_events())
                if self.proc.poll() is not None:
                    break
                if stop_deadline is not None and time.monotonic() >= stop_deadline:
                    log.warning("stop timeout passed; killing the VMM", timeoutSeconds=cfg.stop_timeout_seconds)
                    self.killed_after_timeout = True
                    self.proc.kill()
                    self.proc.wait()
                    break
                fds = [self._wake_r, ready_r]
                if self.qmp is not None and not self.qmp.closed:
                    fds.append(self.qmp.fileno())
                if self.pidfd is not None:
                    fds.append(self.pidfd)
                timeout = POLL_SECONDS if self.pidfd is None else 60.0
                if stop_deadline is not None:
                    wake = stop_deadline if next_graceful is None else min(stop_deadline, next_graceful)
                    timeout = max(0.0, min(timeout, wake - time.monotonic()))
                readable, _unused, _unused = select.select(fds, [], [], timeout)
                if self._wake_r in readable:
                    self._drain(self._wake_r)
                if self.qmp is not None:
                    self._handle_events(self.qmp.poll_events())
                if ready_r in readable:
                    self._drain(ready_r)
                    self._handle_readiness()
        finally:
            self._ready_stop.set()
            os.close(ready_r)
            os.close(ready_w)
        if self.qmp is not None:
            self._handle_events(self.qmp.poll_events())
        rc = self.proc.wait()
        facts = Facts(hypervisor=cfg.hypervisor.type, returncode=rc, stop_requested=self.stop_requested,
                      readiness_timed_out=self.readiness_timed_out, killed_after_timeout=self.killed_after_timeout,
                      shutdown_reason=self.shutdown_reason, guest_panicked=self.guest_panicked,
                      serial_panic=self._serial_shows_panic())
        reason, message = decide(facts, cfg.stop_timeout_seconds)
        if reason == "HypervisorCrashed" and self.vmm_stderr:
            message += f"; last stderr: {self.vmm_stderr[-1]}"
        return reason, message, exit_status(rc)

    def _graceful_stop(self) -> float | None:
        """Ask the guest to shut down (QMP system_powerdown, or Firecracker's SendCtrlAltDel).

        Returns when to ask again (time.monotonic()), or None for never. A guest drops a request its init cannot
        handle yet (the power button before logind runs, Ctrl-Alt-Del before systemd does: a stop right after a
        start), so a sent request is repeated every ``stopRetryIntervalSeconds`` (0: never) until the guest is
        gone or the stop deadline passes. Firecracker's API socket not listening yet (a stop right after the VMM
        started): again in GRACEFUL_RETRY_SECONDS. No QMP, or a request that failed: never (the stop timeout
        then ends in a kill).
        """
        why = "readiness timeout" if self.readiness_timed_out and not self.stop_requested else self.stop_signal
        self.graceful_attempts += 1
        # Only the first attempt's failure is worth a warning: a repeat fails when the VMM is already on its way out
        # (QMP closing as QEMU exits).
        first = self.graceful_attempts == 1
        try:
            if self.cfg.hypervisor.type == "qemu":
                method = "QMP system_powerdown"
                if self.qmp is None or self.qmp.closed:
                    if first:
                        log.warning("graceful stop impossible without QMP; waiting for the stop timeout")
                    return None
                self.qmp.execute("system_powerdown")
            else:
                method = "SendCtrlAltDel"
                firecracker_api.send_ctrl_alt_del(self.fc_api_socket)
            log.info("graceful stop sent", method=method, cause=why, attempt=self.graceful_attempts)
        except firecracker_api.ApiNotListening:
            self.graceful_attempts -= 1
            return time.monotonic() + GRACEFUL_RETRY_SECONDS
        except (QmpError, firecracker_api.ApiError) as exc:
            if first:
                log.warning("graceful stop failed; waiting for the stop timeout", error=str(exc))
            else:
                log.info("graceful stop not repeated", attempt=self.graceful_attempts, error=str(exc))
            return None
        interval = self.cfg.stop_retry_interval_seconds
        return time.monotonic() + interval if interval > 0 else None

    def _handle_events(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            name = ev.get("event")
            data = ev.get("data") or {}
            if name == "SHUTDOWN":
                self.shutdown_reason = data.get("reason")
                log.info("qemu shutdown event", reason=self.shutdown_reason, guest=data.get("guest"))
            elif name == "GUEST_PANICKED":
                self.guest_panicked = True
                log.warning("guest panicked", action=data.get("action"))
            elif name in ("RESET", "POWERDOWN", "STOP"):
                log.info("qemu event", event=name)

    def _readiness(self, ready_w: int) -> None:
        r = self.cfg.readiness
        assert r is not None
        banner = readiness.wait_for_banner(r.host, r.port, r.timeout_seconds, self._ready_stop)
        self._ready_outcome.append(banner)
        try:
            os.write(ready_w, b"r")
        except OSError:
            pass

    def _handle_readiness(self) -> None:
        if not self._ready_outcome or self.ready_at is not None or self.readiness_timed_out:
            return
        banner = self._ready_outcome[0]
        if banner is not None:
            self._mark_ready(banner)
        elif not self._ready_stop.is_set() and self._alive():
            r = self.cfg.readiness
            self.readiness_timed_out = True
            log.warning("readiness timeout: no SSH banner; stopping the guest",
                        host=r.host if r else None, port=r.port if r else None,
                        timeoutSeconds=r.timeout_seconds if r else None)
            self._release_boot_slot("readiness timeout")

    def _mark_ready(self, banner: bytes | None) -> None:
        self.ready_at = log.rfc3339()
        marker = {"bootID": self.cfg.vm.boot_id, "readyAt": self.ready_at,
                  "banner": banner.split(b"\r")[0].split(b"\n")[0].decode(errors="replace") if banner else None}
        write_atomic(self.cfg.ready_marker_path, (json.dumps(marker) + "\n").encode())
        log.info("guest ready", readyAt=self.ready_at, banner=marker["banner"])
        self._release_boot_slot("guest ready")

    def _serial_shows_panic(self) -> bool:
        try:
            with open(self.cfg.serial_log_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(self.serial_offset, size - 1024 * 1024))
                return PANIC_MARKER in fh.read()
        except OSError:
            return False

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # -- cleanup ---------------------------------------------------------------------------------------
    def _cleanup(self, status: int | None) -> int | None:
        """Leave nothing behind: VMM dead and reaped, TAP removed (if ours), transient files gone."""
        self._ready_stop.set()
        self._release_boot_slot("run ended")
        if self.proc is not None:
            if self.proc.poll() is None:
                log.warning("killing the VMM during cleanup", pid=self.proc.pid)
                self.proc.kill()
            rc = self.proc.wait()
            if status is None:
                status = exit_status(rc)
        self._stop_watchdog()
        if self.qmp is not None:
            self.qmp.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if self.tap_created:
            try:
                tap.remove(self.tap_created)
                log.info("tap removed", tap=self.tap_created)
            except tap.TapError as exc:
                log.error("cannot remove tap", tap=self.tap_created, error=str(exc))
        for path in (*self.paths.transient(), self.cfg.ready_marker_path):
            try:
                _unlink(path)
            except OSError as exc:
                log.error("cannot remove runtime file", path=path, error=str(exc))
        self._cleanup_jail()
        return status

    def _cleanup_jail(self) -> None:
        if self.jail_run_fd is not None:
            os.close(self.jail_run_fd)
            self.jail_run_fd = None
        if self.jail_rootfs_owner is not None:
            disk, uid, gid = self.jail_rootfs_owner
            try:
                os.chown(disk, uid, gid)
            except OSError as exc:
                log.error("cannot restore the root disk's owner", path=disk, error=str(exc))
        if self.jail_dir is not None:
            shutil.rmtree(self.jail_dir, ignore_errors=True)
            if os.path.lexists(self.jail_dir):
                log.error("cannot remove the jail", path=self.jail_dir)
