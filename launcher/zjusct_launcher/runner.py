"""The run state machine: validate -> lock -> prepare -> start VMM -> readiness -> wait -> stop -> result.

The hypervisor-independent run lives here: config, runtimeDir and its lock, boot slot, config disk, serial log,
TAP, the VMM process (session, PR_SET_PDEATHSIG, watchdog, pidfd, stderr relay), readiness, stop signals, the stop
deadline and its repeats, reason and result. What differs per hypervisor is the run's :class:`vmm.Vmm`
(:mod:`vmm_qemu`, :mod:`vmm_firecracker`): this module never names a hypervisor type. Decisions are in
:mod:`config`, :mod:`decide`, :mod:`identity`. The result is written on every exit path except AlreadyRunning
(another launcher owns it) and a config file that cannot be read as JSON at all (no result path is known then).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from zjusct_launcher import config as cfgmod
from zjusct_launcher import environment, identity, lock, log, readiness, tap, vmm
from zjusct_launcher.decide import Facts, decide, exit_status
from zjusct_launcher.fs import publish, write_atomic
from zjusct_launcher.paths import RuntimePaths
from zjusct_launcher.result import EXIT_ALREADY_RUNNING, Result
from zjusct_launcher.vmm import RunFailed

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_SECONDS = 1.0
BOOT_SLOT_POLL_SECONDS = 0.2  # how often a launcher waiting for a boot slot tries the slots again
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
        raw_boot_id = vm.get("bootID")
        boot_id = raw_boot_id if isinstance(raw_boot_id, int) else 0
        res = Result(vm=vm, boot_id=boot_id, reason="ConfigInvalid", started_at=log.rfc3339(started),
                     finished_at=log.rfc3339(), message="; ".join(problems))
        for err in publish(res, path, term):
            log.error("cannot write result", error=err)
        return res.exit_code
    return runner.run(cfg)


class Runner:
    """One run of one LauncherConfig (:meth:`run`), its hypervisor the :class:`vmm.Vmm` of ``hypervisor.type``.

    Installs the SIGTERM/SIGINT/SIGHUP handlers when made (a stop request); ``started`` is the run's start
    (time.time(), the result's ``startedAt``).
    """

    def __init__(self, started: float):
        self.started = started
        self.stop_requested = False
        self.stop_signal: str | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.tap_created: str | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.watchdog_sock: socket.socket | None = None
        self.ready_at: str | None = None
        self.readiness_timed_out = False
        self.killed_after_timeout = False
        self.graceful_attempts = 0  # graceful stop attempts in this run (each sent one is logged with its number)
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
        self.vmm = vmm.for_config(cfg, self.paths)
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
        except RunFailed as exc:
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
        binary = self.vmm.resolve()
        accel = self.vmm.decide_accel(binary)
        if not self._take_boot_slot():
            return "StopRequested", f"{self.stop_signal} while waiting for a boot slot; nothing was started", None
        self._prepare()
        self.vmm.prepare_sandbox(binary)
        if self.stop_requested:
            return "StopRequested", f"{self.stop_signal} before the VMM started; nothing was started", None
        self._start_vmm(binary, accel)
        return self._supervise()

    def _take_boot_slot(self) -> bool:
        """Wait for one of the host's boot slots (config ``bootSlots``; none configured: no wait).

        The slot is held from here until the guest is ready, its readiness times out, or the run ends (see
        :meth:`_release_boot_slot`), so at most ``bootSlots.count`` guests of the host boot at once; the
        readiness timeout counts from the VMM's start, after the wait. Returns False when a stop signal arrived
        while waiting. Raises RunFailed(LauncherError) when the slot directory cannot be used.
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
                raise RunFailed("LauncherError", f"bootSlots.directory {slots.directory}: {exc}") from None
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
        """The config disk, the VMM's own files (:meth:`vmm.Vmm.prepare_files`), the serial log's directory and
        this boot's offset in it, the TAP (``network.createTap``)."""
        cfg, paths = self.cfg, self.paths
        fd = os.open(paths.identity_disk, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(identity.build(cfg))
        self.vmm.prepare_files()
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
                raise RunFailed("LauncherError", str(exc)) from None
            self.tap_created = cfg.network.tap
            log.info("tap created", tap=cfg.network.tap, bridge=cfg.network.bridge)

    def _start_vmm(self, binary: str, accel: str) -> None:
        cfg, paths = self.cfg, self.paths
        argv = self.vmm.command(binary, accel)
        stdout: Any = open(cfg.serial_log_path, "ab") if self.vmm.console_on_stdout else subprocess.DEVNULL
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
            raise RunFailed("HypervisorMissing", f"cannot start {binary}: {exc.strerror}") from None
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
                raise RunFailed("LauncherError", "pidfd_open failed: the VMM watchdog cannot be armed (Linux >= 5.3 "
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
            raise RunFailed("LauncherError", f"cannot start the VMM watchdog: {exc.strerror}") from None
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
        self.vmm.attach(self._alive)
        if cfg.serial_console is not None:
            vmm.capability_method(self.vmm, "serialConsole")()
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
                if self.vmm.observed.shutdown_reason is not None:
                    next_graceful = None  # QEMU's SHUTDOWN event: the guest is going; nothing to repeat
                now = time.monotonic()
                if next_graceful is not None and stop_deadline is not None and next_graceful <= now < stop_deadline \
                        and self.proc.poll() is None:
                    next_graceful = self._graceful_stop()
                    self.vmm.poll_events()  # events that arrived with the command's reply
                if self.proc.poll() is not None:
                    break
                if stop_deadline is not None and time.monotonic() >= stop_deadline:
                    log.warning("stop timeout passed; killing the VMM", timeoutSeconds=cfg.stop_timeout_seconds)
                    self.killed_after_timeout = True
                    self.proc.kill()
                    self.proc.wait()
                    break
                fds = [self._wake_r, ready_r, *self.vmm.event_fds()]
                if self.pidfd is not None:
                    fds.append(self.pidfd)
                timeout = POLL_SECONDS if self.pidfd is None else 60.0
                if stop_deadline is not None:
                    wake = stop_deadline if next_graceful is None else min(stop_deadline, next_graceful)
                    timeout = max(0.0, min(timeout, wake - time.monotonic()))
                readable, _unused, _unused = select.select(fds, [], [], timeout)
                if self._wake_r in readable:
                    self._drain(self._wake_r)
                self.vmm.poll_events()
                if ready_r in readable:
                    self._drain(ready_r)
                    self._handle_readiness()
        finally:
            self._ready_stop.set()
            os.close(ready_r)
            os.close(ready_w)
        self.vmm.poll_events()
        rc = self.proc.wait()
        observed = self.vmm.observed
        facts = Facts(hypervisor=self.vmm.profile.type, returncode=rc, stop_requested=self.stop_requested,
                      readiness_timed_out=self.readiness_timed_out, killed_after_timeout=self.killed_after_timeout,
                      shutdown_reason=observed.shutdown_reason, guest_panicked=observed.guest_panicked,
                      serial_panic=self._serial_shows_panic())
        reason, message = decide(facts, cfg.stop_timeout_seconds)
        if reason == "HypervisorCrashed" and self.vmm_stderr:
            message += f"; last stderr: {self.vmm_stderr[-1]}"
        return reason, message, exit_status(rc)

    def _graceful_stop(self) -> float | None:
        """Ask the guest to shut down (:meth:`vmm.Vmm.request_stop`: QMP system_powerdown, or Firecracker's
        SendCtrlAltDel).

        Returns when to ask again (time.monotonic()), or None for never. A guest drops a request its init cannot
        handle yet (the power button before logind runs, Ctrl-Alt-Del before systemd does: a stop right after a
        start), so a sent request is repeated every ``stopRetryIntervalSeconds`` (0: never) until the guest is
        gone or the stop deadline passes. A VMM that cannot take the request yet (Firecracker's API socket not
        listening, a stop right after the VMM started: :class:`vmm.StopRetry`): again when it says, not counted as
        an attempt. No way to ask (QEMU without QMP), or a request that failed: never (the stop timeout then ends
        in a kill).
        """
        why = "readiness timeout" if self.readiness_timed_out and not self.stop_requested else self.stop_signal
        self.graceful_attempts += 1
        # Only the first attempt's failure is worth a warning: a repeat fails when the VMM is already on its way out
        # (QMP closing as QEMU exits).
        first = self.graceful_attempts == 1
        try:
            method = self.vmm.request_stop()
            log.info("graceful stop sent", method=method, cause=why, attempt=self.graceful_attempts)
        except vmm.StopRetry as exc:
            self.graceful_attempts -= 1
            return time.monotonic() + exc.seconds
        except vmm.StopUnavailable as exc:
            if first:
                log.warning(str(exc))
            return None
        except vmm.StopFailed as exc:
            if first:
                log.warning("graceful stop failed; waiting for the stop timeout", error=str(exc))
            else:
                log.info("graceful stop not repeated", attempt=self.graceful_attempts, error=str(exc))
            return None
        interval = self.cfg.stop_retry_interval_seconds
        return time.monotonic() + interval if interval > 0 else None

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
        """Leave nothing behind: VMM dead and reaped, TAP removed (if ours), transient files gone, and what the VMM
        set up undone (:meth:`vmm.Vmm.cleanup`: QMP closed, the jail removed)."""
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
        self.vmm.cleanup()
        return status
