"""Firecracker as the run's VMM (:class:`vmm.Vmm`): the effects of a Firecracker boot; the config document and
the command lines are :mod:`firecracker`'s, the API client :mod:`firecracker_api`'s.

* Accelerator: always KVM (Firecracker has no TCG): ``/dev/kvm`` must answer KVM_GET_API_VERSION, and when QEMU is
  installed the probe guest must run under it (:func:`kvm.probe`); otherwise ``HypervisorMissing``.
* Files: without the jailer, ``<runtimeDir>/firecracker.json`` (0600). With ``hypervisor.jailer`` (and
  ``hypervisor.runAs``), the chroot ``<chrootBaseDir>/<binary name>/<id>/root``: read-only copies of the kernel,
  initrd, config disk and config file owned by runAs, the root disk hard-linked (the same inode) and chowned to
  runAs for the run; :meth:`FirecrackerVmm.cleanup` gives the disk its owner back and removes the jail.
* Root disk growth (``rootDisk.sizeMiB``): the file is extended (sparse) before Firecracker starts
  (:func:`grow_file`).
* Console: Firecracker's stdout (the Runner appends it to ``serialLogPath``). No events: Firecracker exits on a
  guest reset (:mod:`decide`). The graceful stop is ``SendCtrlAltDel`` on the API socket, retried every
  :data:`GRACEFUL_RETRY_SECONDS` while the socket is bound but not yet listening.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from typing import Callable

from zjusct_launcher import firecracker, firecracker_api, kvm, log, qemu
from zjusct_launcher.config import LauncherConfig
from zjusct_launcher.fs import write_atomic
from zjusct_launcher.paths import RuntimePaths
from zjusct_launcher.vmm import Observed, RunFailed, StopFailed, StopRetry, find_executable, log_kvm_verdict

GRACEFUL_RETRY_SECONDS = 0.05  # the API not listening yet at a stop: try SendCtrlAltDel again this often


def grow_file(path: str | None, size_mib: int | None) -> None:
    """``rootDisk.sizeMiB`` for Firecracker (raw files only): extend the root disk file to ``size_mib`` MiB (sparse)
    when it is smaller, before Firecracker opens it; never shrinks it.

    Raises:
        RunFailed: ``LauncherError`` when the file cannot be grown (the guest never runs on a smaller disk).
    """
    if path is None or size_mib is None:
        return
    wanted = size_mib * 1048576
    try:
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode):  # a block device is not grown here: it must be large enough
            with open(path, "rb") as dev:
                current = dev.seek(0, os.SEEK_END)
            if current < wanted:
                raise RunFailed("LauncherError", f"rootDisk.sizeMiB: the block device {path} has "
                                f"{current // 1048576} MiB, below the {size_mib} MiB asked (a device is not grown)")
            return
        current = st.st_size
        if current < wanted:
            os.truncate(path, wanted)
            log.info("root disk grown", from_mib=current // 1048576, to_mib=size_mib)
    except OSError as exc:
        raise RunFailed("LauncherError", f"rootDisk.sizeMiB: cannot grow {path} to {size_mib} MiB: "
                        f"{exc.strerror}") from None


class FirecrackerVmm:
    """Firecracker for one run of ``cfg`` (see the module docstring; the methods are :class:`vmm.Vmm`'s)."""

    profile = firecracker.PROFILE
    console_on_stdout = True

    def __init__(self, cfg: LauncherConfig, paths: RuntimePaths):
        self.cfg = cfg
        self.paths = paths
        self.observed = Observed()  # stays empty: Firecracker sends no events
        self.jailer: str | None = None  # the jailer's path (hypervisor.jailer), found by resolve
        self.jail_dir: str | None = None  # <chrootBaseDir>/<exec name>/<id>, removed at cleanup
        self.jail_rootfs_owner: tuple[str, int, int] | None = None  # (path, uid, gid) to restore at cleanup
        self.jail_run_fd: int | None = None  # O_PATH fd of <jail>/root/run: a short API socket path

    def resolve(self) -> str:
        binary = find_executable(self.cfg.hypervisor.binary, firecracker.DEFAULT_BINARY, "hypervisor.binary")
        jail = self.cfg.hypervisor.jailer
        if jail is not None:
            self.jailer = find_executable(jail.binary, "jailer", "hypervisor.jailer.binary")
        return binary

    def decide_accel(self, binary: str) -> str:
        ok, detail = kvm.kvm_device_usable()
        qemu_bin = shutil.which(qemu.DEFAULT_BINARY)
        verdict = kvm.probe(qemu_bin, self.cfg.hypervisor.kvm_probe_timeout_seconds) if ok and qemu_bin else \
            kvm.KvmVerdict(ok, detail, 0.0)
        log_kvm_verdict(verdict)
        if verdict.usable:
            return "kvm"
        raise RunFailed("HypervisorMissing", f"KVM is not usable ({verdict.detail}) and firecracker needs KVM")

    def prepare_files(self) -> None:
        grow_file(self.cfg.root_disk.path, self.cfg.root_disk.size_mib)
        if self.jailer is None:
            write_atomic(self.paths.fc_config,
                         json.dumps(firecracker.build_config(self.cfg, self.paths), indent=2).encode(), mode=0o600)

    def prepare_sandbox(self, binary: str) -> None:
        """With the jailer: lay out its chroot (the module docstring); without it, nothing."""
        if self.jailer is None:
            return
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
            raise RunFailed("LauncherError", message) from None
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
            raise RunFailed("LauncherError", f"rootDisk.path {disk}: cannot hard-link it into the jail {root} "
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
    def api_socket(self) -> str:
        """The API socket: in runtimeDir, or (jailed) through /proc/self/fd of the jail's /run, which keeps the
        path under the 107 bytes of sun_path whatever chrootBaseDir is."""
        if self.jail_run_fd is not None:
            return f"/proc/self/fd/{self.jail_run_fd}/{os.path.basename(firecracker.JAIL_API_SOCKET)}"
        return self.paths.fc_socket

    def command(self, binary: str, accel: str) -> list[str]:
        if self.jailer is not None:
            return firecracker.build_jailer_argv(self.cfg, self.jailer, binary)
        return firecracker.build_argv(self.cfg, binary, self.paths)

    def attach(self, alive: Callable[[], bool]) -> None:
        """Nothing: the API socket is reached per request (:meth:`request_stop`)."""

    def event_fds(self) -> list[int]:
        return []

    def poll_events(self) -> None:
        """Nothing: Firecracker sends no events."""

    def request_stop(self) -> str:
        try:
            firecracker_api.send_ctrl_alt_del(self.api_socket)
        except firecracker_api.ApiNotListening:
            raise StopRetry(GRACEFUL_RETRY_SECONDS) from None
        except firecracker_api.ApiError as exc:
            raise StopFailed(str(exc)) from exc
        return "SendCtrlAltDel"

    def cleanup(self) -> None:
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
