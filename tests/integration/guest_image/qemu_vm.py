"""A minimal QEMU/TCG runner for guest image tests and the bench (not the launcher: plain qemu-system-x86_64).

Boots ``vmlinuz``/``initrd.img`` with the image's default cmdline, a private sparse copy of ``rootfs.raw`` as the
first virtio-blk disk, the identity config disk read-only as the second, user-mode networking with SSH forwarded
from 127.0.0.1, serial to a file and a QMP socket. QEMU gets PR_SET_PDEATHSIG=SIGKILL so a dying test process
cannot leave it running; :meth:`Vm.close` stops it by pid.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from zjusct_launcher import lock
from zjusct_launcher.qemu import MACHINE

from tests.guest_image_fixture import GuestImage, config_disk

PR_SET_PDEATHSIG = 1
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"]


def _pdeathsig() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_key(directory: Path) -> tuple[Path, str]:
    """A fresh ed25519 key pair; returns (private key path, public key line)."""
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "zjusct-test", "-f", str(key)],
                   check=True, timeout=30)
    return key, (directory / "id_ed25519.pub").read_text().strip()


@dataclass
class Vm:
    """One running guest; ``workdir`` holds its disk copy, config disk, serial log and QMP socket."""

    image: GuestImage
    workdir: Path
    name: str
    instance_id: str
    authorized_keys: list[str]
    mac: str = "52:54:00:12:34:56"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    # {"directory", "count"}: hold one of the machine's boot slots (the launcher's bootSlots) from start until SSH
    boot_slots: dict | None = None
    slot_fd: int | None = None

    @property
    def serial_log(self) -> Path:
        return self.workdir / "serial.log"

    @property
    def qmp_path(self) -> Path:
        return self.workdir / "qmp.sock"

    @property
    def disk(self) -> Path:
        return self.workdir / "root.raw"

    def prepare(self) -> None:
        """Copy the rootfs (sparse; never boot the image itself) and write the config disk."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.disk.exists():
            subprocess.run(["cp", "--sparse=always", str(self.image.rootfs), str(self.disk)], check=True, timeout=300)
            self.disk.chmod(0o644)
        network = {"MAC": self.mac, "IPV4": "10.0.2.15/24", "GATEWAY": "10.0.2.2", "DNS": "10.0.2.3"}
        (self.workdir / "config.tar").write_bytes(
            config_disk(self.instance_id, self.name, self.authorized_keys, network))

    def take_boot_slot(self, timeout: float = 3600.0) -> None:
        """Wait for a free boot slot (no-op without ``boot_slots``); released by :meth:`release_boot_slot`."""
        if self.boot_slots is None or self.slot_fd is not None:
            return
        deadline = time.monotonic() + timeout
        while (got := lock.try_boot_slot(self.boot_slots["directory"], self.boot_slots["count"])) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no boot slot free within {timeout}s")
            time.sleep(0.2)
        self.slot_fd = got[0]

    def release_boot_slot(self) -> None:
        """Free the boot slot taken by :meth:`take_boot_slot`, if held."""
        if self.slot_fd is not None:
            os.close(self.slot_fd)
            self.slot_fd = None

    def start(self, memory_mib: int = 512) -> None:
        """Start QEMU (after taking a boot slot when ``boot_slots`` is set)."""
        self.take_boot_slot()
        self.prepare()
        self.qmp_path.unlink(missing_ok=True)
        argv = [
            shutil.which("qemu-system-x86_64") or "qemu-system-x86_64",
            "-name", self.name, "-accel", "tcg,tb-size=256", "-M", MACHINE, "-m", str(memory_mib), "-smp", "1",
            "-no-reboot", "-nodefaults", "-display", "none", "-no-user-config",
            "-kernel", str(self.image.vmlinuz), "-initrd", str(self.image.initrd),
            "-append", self.image.default_cmdline,
            "-drive", f"file={self.disk},format=raw,if=none,id=root,cache=writeback",
            "-device", "virtio-blk-pci,drive=root",
            "-drive", f"file={self.workdir / 'config.tar'},format=raw,if=none,id=cfg,readonly=on",
            "-device", "virtio-blk-pci,drive=cfg",
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}",
            # Entropy: without it (and without RDRAND, absent from TCG's default CPU) getrandom() in early boot
            # waits for the kernel's jitter entropy, which stalls ssh-keygen for a minute under TCG.
            "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
            "-serial", f"file:{self.serial_log}",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            "-monitor", "none",
        ]
        self.started_at = time.monotonic()
        # Start from the main thread: PR_SET_PDEATHSIG fires when the *thread* that forked QEMU exits.
        with open(self.workdir / "qemu.stderr", "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=_pdeathsig)

    def wait_ssh_banner(self, timeout: float = 300.0) -> float:
        """Seconds from start until the guest's sshd sends ``SSH-`` (a bare TCP accept proves nothing: slirp
        accepts before sshd runs). Raises TimeoutError with the serial log tail."""
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name}: QEMU exited ({self.proc.returncode}) before SSH:\n{self.tail()}")
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                        s.settimeout(10)
                        if s.recv(4) == b"SSH-":
                            return time.monotonic() - self.started_at
                except OSError:
                    pass
                time.sleep(1)
            raise TimeoutError(f"{self.name}: no SSH banner within {timeout}s:\n{self.tail()}")
        finally:
            self.release_boot_slot()

    def ssh(self, key: Path, command: str, timeout: float = 120.0) -> str:
        """Run ``command`` as root in the guest; returns stdout, raises CalledProcessError on failure."""
        proc = subprocess.run(["ssh", "-i", str(key), *SSH_OPTS, "-p", str(self.port), "root@127.0.0.1", command],
                              capture_output=True, text=True, timeout=timeout, check=True)
        return proc.stdout

    def host_key_fingerprint(self, timeout: float = 60.0) -> str:
        """SHA256 fingerprint of the ed25519 host key the guest's sshd presents (ssh-keyscan, from the host)."""
        scan = subprocess.run(["ssh-keyscan", "-T", "30", "-t", "ed25519", "-p", str(self.port), "127.0.0.1"],
                              capture_output=True, text=True, timeout=timeout, check=True)
        lines = [line for line in scan.stdout.splitlines() if line and not line.startswith("#")]
        if not lines:
            raise RuntimeError(f"{self.name}: ssh-keyscan returned no ed25519 key: {scan.stderr}")
        fp = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=lines[0] + "\n", capture_output=True, text=True,
                            timeout=30, check=True)
        return fp.stdout.split()[1]

    def qmp(self, command: str, timeout: float = 30.0) -> dict:
        """Send one QMP command (after capabilities negotiation) and return its reply."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.qmp_path))
            f = s.makefile("rw")
            json.loads(f.readline())
            f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n")
            f.flush()
            json.loads(f.readline())
            f.write(json.dumps({"execute": command}) + "\n")
            f.flush()
            while True:
                reply = json.loads(f.readline())
                if "return" in reply or "error" in reply:
                    return reply

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.serial_log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no serial log)"

    def close(self) -> None:
        """Stop QEMU by pid (SIGTERM, then SIGKILL) if it is still running."""
        self.release_boot_slot()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
