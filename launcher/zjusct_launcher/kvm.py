"""Bounded usable-KVM probe.

``/dev/kvm`` existing proves little: on nested or broken hosts KVM_CREATE_VM succeeds but vCPUs never run
(shared/recipes/guest.md). The probe therefore runs QEMU with ``-accel kvm`` on a 64 KiB firmware whose reset
vector writes one byte to QEMU's ``isa-debug-exit`` port; QEMU then exits with status ``(0x31 << 1) | 1 = 99``
(hw/misc/debugexit.c). Any other outcome, or no exit within the timeout, means KVM is not usable.

Real mode running is not enough either: on some nested hosts the firmware probe passes and a Linux kernel's
real-mode setup code prints, but nothing runs once the kernel has switched to long mode (measured on this
project's CI machines: "Probing EDD ... ok", then silence under KVM; the same kernel boots under TCG). So when
the caller names the guest's kernel, the probe also boots it (no disk, no initrd) and waits for the kernel's own
first message, ``Linux version`` (printed by start_kernel, init/main.c, through ``earlyprintk``), which is
written from 64-bit code. The verdict is computed at most once per launcher run (the caller keeps it).
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass

from zjusct_launcher.config import TCG_CPU_MODEL

DEBUG_EXIT_PORT = 0xF4
PROBE_VALUE = 0x31
PROBE_EXIT_STATUS = (PROBE_VALUE << 1) | 1
KVM_GET_API_VERSION = 0xAE00  # linux/kvm.h _IO(KVMIO, 0x00); the stable API version is 12.
KERNEL_MARK = b"Linux version"


@dataclass(frozen=True)
class KvmVerdict:
    usable: bool
    detail: str
    seconds: float


def probe_firmware() -> bytes:
    """A 64 KiB BIOS image (QEMU requires a multiple of 64 KiB) whose reset vector (offset 0xFFF0) runs
    ``mov al, 0x31; out 0xf4, al; cli; hlt; jmp hlt``."""
    code = bytes([0xB0, PROBE_VALUE, 0xE6, DEBUG_EXIT_PORT, 0xFA, 0xF4, 0xEB, 0xFD])
    image = bytearray(65536)
    image[0xFFF0:0xFFF0 + len(code)] = code
    return bytes(image)


def kvm_device_usable(device: str = "/dev/kvm") -> tuple[bool, str]:
    """Open the device and ask KVM_GET_API_VERSION (must be 12). Cheap, necessary, not sufficient."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"{device}: {exc.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return False, f"{device}: KVM_GET_API_VERSION failed: {exc.strerror}"
    finally:
        os.close(fd)
    if version != 12:
        return False, f"{device}: KVM API version {version}, expected 12"
    return True, f"{device}: KVM API version 12"


def probe(qemu_binary: str, timeout_seconds: float, accel: str = "kvm", device: str = "/dev/kvm",
          kernel: str | None = None) -> KvmVerdict:
    """Run the probe guest under ``accel`` (``kvm``; ``tcg`` only to test the probe itself).

    Args:
        qemu_binary: path of qemu-system-x86_64.
        timeout_seconds: bound of each stage (firmware, then kernel); QEMU is killed when it runs out.
        accel: ``kvm`` (``tcg`` only to test the probe).
        device: the KVM device node.
        kernel: the guest's kernel (bzImage); when given, it must print ``Linux version`` as well.

    Never raises for probe failures; returns the verdict.
    """
    start = time.monotonic()
    if accel == "kvm":
        ok, detail = kvm_device_usable(device)
        if not ok:
            return KvmVerdict(False, detail, time.monotonic() - start)
    with tempfile.TemporaryDirectory(prefix="zjusct-kvm-probe-") as tmp:
        bios = os.path.join(tmp, "probe.bin")
        with open(bios, "wb") as fh:
            fh.write(probe_firmware())
        # Same machine and CPU model as a real KVM run (-cpu host; TCG: the default model): on some hosts KVM runs
        # real-mode code but QEMU aborts setting the host CPU's MSRs (-cpu host), which only this probe catches.
        cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", TCG_CPU_MODEL]
        argv = [qemu_binary, "-accel", accel, "-M", "q35", *cpu, "-m", "16", "-nodefaults", "-no-user-config",
                "-display", "none", "-bios", bios,
                "-device", f"isa-debug-exit,iobase={DEBUG_EXIT_PORT:#x},iosize=0x04"]
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=timeout_seconds, check=False)
        except subprocess.TimeoutExpired:
            return KvmVerdict(False, f"probe guest did not finish within {timeout_seconds:g} s under {accel}",
                              time.monotonic() - start)
        except OSError as exc:
            return KvmVerdict(False, f"cannot run {qemu_binary}: {exc.strerror}", time.monotonic() - start)
    elapsed = time.monotonic() - start
    if proc.returncode != PROBE_EXIT_STATUS:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] if proc.stderr else []
        return KvmVerdict(False, f"probe guest exited {proc.returncode} under {accel}"
                          + (f": {tail[0]}" if tail else ""), elapsed)
    if kernel is None:
        return KvmVerdict(True, f"probe guest ran under {accel} in {elapsed:.2f} s", elapsed)
    ok, detail = _kernel_prints(qemu_binary, accel, cpu, kernel, timeout_seconds)
    elapsed = time.monotonic() - start
    return KvmVerdict(ok, f"{detail} (probe guest and kernel in {elapsed:.2f} s)", elapsed)


def _kernel_prints(qemu_binary: str, accel: str, cpu: list[str], kernel: str, timeout_seconds: float) \
        -> tuple[bool, str]:
    """Boot ``kernel`` without disks and wait up to ``timeout_seconds`` for :data:`KERNEL_MARK` on the serial port."""
    argv = [qemu_binary, "-accel", accel, "-M", "q35", *cpu, "-m", "128", "-nodefaults", "-no-user-config",
            "-display", "none", "-no-reboot", "-serial", "stdio", "-kernel", kernel,
            "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return False, f"cannot run {qemu_binary}: {exc.strerror}"
    assert proc.stdout is not None  # stdout=PIPE
    seen = b""
    deadline = time.monotonic() + timeout_seconds
    try:
        while KERNEL_MARK not in seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, (f"kernel {os.path.basename(kernel)} printed no '{KERNEL_MARK.decode()}' within "
                               f"{timeout_seconds:g} s under {accel} (serial: {seen[-80:]!r})")
            ready, _unused, _unused2 = select.select([proc.stdout], [], [], remaining)
            chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
            if ready and not chunk:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                return False, f"kernel {os.path.basename(kernel)} did not start under {accel}: " + \
                    (err.splitlines()[-1] if err else f"QEMU exited {proc.wait()}")
            seen = (seen + chunk)[-4096:]
        return True, f"kernel {os.path.basename(kernel)} runs under {accel}"
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
