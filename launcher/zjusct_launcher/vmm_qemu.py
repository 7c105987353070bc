"""QEMU as the run's VMM (:class:`vmm.Vmm`): the effects of a QEMU boot; the command line is :mod:`qemu`'s.

* Accelerator: ``hypervisor.accel: tcg`` as asked; otherwise the bounded KVM probe, which also boots the guest's
  own kernel (:func:`kvm.probe`); ``auto`` with ``allowTCG`` falls back to TCG.
* Files: ``rbd.secret`` (0600), the key of ``[client.<user>]`` from ``rootDisk.rbd.keyringPath``, passed to QEMU
  as a ``secret`` object file (never on the command line, never logged). No sandbox to prepare: QEMU drops
  privileges itself (``-runas``) after opening everything, under its own seccomp filter (``-sandbox``).
* Control: QMP on ``<runtimeDir>/qmp.sock``; its SHUTDOWN and GUEST_PANICKED events feed the reason
  (:mod:`decide`), and the graceful stop is ``system_powerdown`` (the ACPI power button).
* Disk I/O limits: with ``rootDisk.ioLimits`` QEMU starts paused (``-S``); :meth:`QemuVmm.attach` sets the root
  device's ``block_set_io_throttle`` and only then resumes it (``cont``), so no request of the guest runs
  unlimited. Without QMP, or when QEMU refuses the limits, the boot fails (``LauncherError``) and QEMU is killed:
  a guest never runs without the limits its config asks for.
* Root disk growth: with ``rootDisk.sizeMiB`` QEMU starts paused too; :meth:`QemuVmm.attach` grows a smaller root
  disk (``block_resize``) before ``cont``; a failure ends the boot (``LauncherError``).
* Serial console: with ``serialConsole`` QEMU listens on its socket (:func:`qemu.serial_chardev`);
  :meth:`QemuVmm.open_serial_console` hands the socket to ``serialConsole.uid``/``gid`` (0600) once QEMU made it,
  and :meth:`QemuVmm.cleanup` removes it.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable

from zjusct_launcher import kvm, log, qemu
from zjusct_launcher.config import LauncherConfig
from zjusct_launcher.paths import RuntimePaths
from zjusct_launcher.qmp import QmpClient, QmpError
from zjusct_launcher.vmm import Observed, RunFailed, StopFailed, StopUnavailable, find_executable, log_kvm_verdict

QMP_CONNECT_TIMEOUT_SECONDS = 30.0


class QemuVmm:
    """QEMU for one run of ``cfg`` (see the module docstring; the methods are :class:`vmm.Vmm`'s)."""

    profile = qemu.PROFILE
    console_on_stdout = False

    def __init__(self, cfg: LauncherConfig, paths: RuntimePaths):
        self.cfg = cfg
        self.paths = paths
        self.observed = Observed()
        self.qmp: QmpClient | None = None

    def resolve(self) -> str:
        return find_executable(self.cfg.hypervisor.binary, qemu.DEFAULT_BINARY, "hypervisor.binary")

    def decide_accel(self, binary: str) -> str:
        hyp = self.cfg.hypervisor
        if hyp.accel == "tcg":
            return "tcg"
        verdict = kvm.probe(binary, hyp.kvm_probe_timeout_seconds, kernel=self.cfg.boot.kernel or None)
        log_kvm_verdict(verdict)
        if verdict.usable:
            return "kvm"
        if hyp.accel == "auto" and hyp.allow_tcg:
            return "tcg"
        raise RunFailed("HypervisorMissing", f"KVM is not usable ({verdict.detail}) and "
                        + ("TCG is not allowed" if hyp.accel == "auto" else "hypervisor.accel is kvm"))

    def prepare_files(self) -> None:
        rbd = self.cfg.root_disk.rbd
        if rbd is None or not rbd.keyring_path:
            return
        try:
            with open(rbd.keyring_path, encoding="utf-8") as fh:
                key = qemu.keyring_key(fh.read(), rbd.user)
        except (OSError, ValueError) as exc:
            raise RunFailed("LauncherError", f"rootDisk.rbd.keyringPath {rbd.keyring_path}: {exc}") from None
        fd = os.open(self.paths.rbd_secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)

    def prepare_sandbox(self, binary: str) -> None:
        """Nothing: QEMU's sandbox is on its command line (``-sandbox``, ``-runas``; :func:`qemu.sandbox_args`)."""

    def command(self, binary: str, accel: str) -> list[str]:
        root = self.cfg.root_disk.path
        is_blk = root is not None and stat.S_ISBLK(os.stat(root).st_mode)
        return qemu.build_argv(self.cfg, binary, accel, self.paths, is_blk)

    def attach(self, alive: Callable[[], bool]) -> None:
        throttle = qemu.io_throttle(self.cfg.root_disk.io_limits)
        paused = qemu.paused_start(self.cfg)
        try:
            self.qmp = QmpClient.connect(self.paths.qmp_socket, QMP_CONNECT_TIMEOUT_SECONDS, alive)
        except QmpError as exc:
            if paused:
                raise RunFailed("LauncherError", f"no QMP connection to prepare the root disk "
                                f"(rootDisk.sizeMiB / rootDisk.ioLimits): {exc}") from None
            log.warning("no QMP connection; a stop will end in a kill", error=str(exc))
            return
        if not paused:
            return
        if self.cfg.root_disk.size_mib is not None:
            self._grow_root(self.cfg.root_disk.size_mib)
        if throttle is not None:
            try:
                self.qmp.execute("block_set_io_throttle", throttle)
            except QmpError as exc:
                raise RunFailed("LauncherError", f"rootDisk.ioLimits: QEMU refused the limits: {exc}") from None
        try:
            self.qmp.execute("cont")
        except QmpError as exc:
            raise RunFailed("LauncherError", f"QEMU did not resume the paused guest (QMP cont): {exc}") from None
        if throttle is not None:
            log.info("disk I/O limits set", **{k: v for k, v in throttle.items() if k != "id" and v})

    def _grow_root(self, size_mib: int) -> None:
        """Grow the root disk to ``size_mib`` MiB while QEMU is paused (``block_resize``; never shrinks it).

        Raises:
            RunFailed: ``LauncherError`` when QEMU cannot say the disk's size or refuses to grow it (a block
                device, an RBD user without write rights): the guest never runs on a disk smaller than asked.
        """
        assert self.qmp is not None
        try:
            current, resize = qemu.root_resize(self.qmp.execute("query-block"), size_mib)
            if resize is not None:
                self.qmp.execute("block_resize", resize, timeout_seconds=60.0)
        except (QmpError, ValueError) as exc:
            raise RunFailed("LauncherError", f"rootDisk.sizeMiB: cannot grow the root disk to {size_mib} MiB: "
                            f"{exc}") from None
        if resize is None:
            log.info("root disk already large enough", size_mib=current // 1048576, asked_mib=size_mib)
        else:
            log.info("root disk grown", from_mib=current // 1048576, to_mib=size_mib)

    def event_fds(self) -> list[int]:
        return [self.qmp.fileno()] if self.qmp is not None and not self.qmp.closed else []

    def poll_events(self) -> None:
        if self.qmp is not None:
            self._handle_events(self.qmp.poll_events())

    def _handle_events(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            name = ev.get("event")
            data = ev.get("data") or {}
            if name == "SHUTDOWN":
                self.observed.shutdown_reason = data.get("reason")
                log.info("qemu shutdown event", reason=self.observed.shutdown_reason, guest=data.get("guest"))
            elif name == "GUEST_PANICKED":
                self.observed.guest_panicked = True
                log.warning("guest panicked", action=data.get("action"))
            elif name in ("RESET", "POWERDOWN", "STOP"):
                log.info("qemu event", event=name)

    def request_stop(self) -> str:
        if self.qmp is None or self.qmp.closed:
            raise StopUnavailable("graceful stop impossible without QMP; waiting for the stop timeout")
        try:
            self.qmp.execute("system_powerdown")
        except QmpError as exc:
            raise StopFailed(str(exc)) from exc
        return "QMP system_powerdown"

    def open_serial_console(self) -> None:
        """Hand QEMU's console socket to ``serialConsole.uid``:``gid``, mode 0600 (capability ``serialConsole``).

        Called once QMP answers, so QEMU has made every chardev. The socket's directory must be root's and writable
        by nobody else: the owner change goes by path, and in a directory another user could write, the path could
        be swapped for a link to another file between the check and the change.

        Raises:
            RunFailed: ``LauncherError`` naming ``serialConsole.socketPath`` when the socket is missing or not a
                socket, its directory is not root's alone, or the owner change fails.
        """
        console = self.cfg.serial_console
        assert console is not None
        path = console.socket_path
        try:
            parent = os.stat(os.path.dirname(path))
            if parent.st_uid != 0 or parent.st_mode & 0o022:
                raise RunFailed("LauncherError", f"serialConsole.socketPath: its directory {os.path.dirname(path)} "
                                f"(uid {parent.st_uid}, mode {parent.st_mode & 0o7777:04o}) must be root's and "
                                "writable by nobody else")
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise RunFailed("LauncherError", f"serialConsole.socketPath: {path} is not a socket")
            os.chown(path, console.uid, console.gid, follow_symlinks=False)
            os.chmod(path, 0o600)
        except OSError as exc:
            raise RunFailed("LauncherError", f"serialConsole.socketPath: {path}: {exc.strerror}") from None
        log.info("serial console open", socket=path, uid=console.uid, gid=console.gid)

    def cleanup(self) -> None:
        if self.qmp is not None:
            self.qmp.close()
        console = self.cfg.serial_console
        if console is not None:
            try:
                if stat.S_ISSOCK(os.lstat(console.socket_path).st_mode):
                    os.unlink(console.socket_path)
            except OSError:
                pass
