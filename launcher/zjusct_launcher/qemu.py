"""QEMU's pure half: its profile, the command line and the RBD key extraction (the run's effects are
:mod:`vmm_qemu`).

Command-line facts (QEMU 7.2 docs, qemu-options.hx / qapi/block-core.json):
* ``-blockdev`` accepts JSON, which avoids comma escaping for paths; ``cache.direct=false`` +
  ``cache.no-flush=false`` is "writeback" (guest flushes reach the disk); ``direct=true`` is "none".
  "unsafe" (``no-flush=true``) is never used.
* The rbd driver takes pool/image/conf/user and ``key-secret`` (id of a ``secret`` object); the key is read
  from a 0600 file in the 0700 runtimeDir, so no secret appears on the command line.
* ``-no-reboot`` makes a guest reboot end QEMU (SHUTDOWN reason guest-reset); ``-action panic=shutdown`` with
  the ``pvpanic`` device turns a guest panic into GUEST_PANICKED + SHUTDOWN reason guest-panic and an exit.
* Option values parsed by QemuOpts escape ',' as ',,'.
* Sandbox (qemu-options.hx ``-sandbox``, ``-runas``): ``-runas uid:gid`` (the numeric form, accepted by QEMU
  7.2 here; no passwd entry needed) makes QEMU setgroups/setgid/setuid to that pair at the end of its start-up,
  after it has opened every file, socket and TAP named on the command line (os_setup_post), so the unprivileged
  VMM keeps those open descriptors and needs no access to the paths. ``-sandbox on,...`` installs a libseccomp
  filter (which also sets no_new_privs). ``elevateprivileges=deny`` forbids setuid/setgid, so it is only used
  without ``-runas``: with it QEMU 7.2 dies of SIGSYS at the drop (measured). ``spawn=deny`` forbids
  fork/exec, hence ``script=no``.
* Disk I/O limits (``rootDisk.ioLimits``) are the root device's BlockBackend throttling, set over QMP with
  ``block_set_io_throttle`` (``bps_rd``, ``bps_wr``, ``iops_rd``, ``iops_wr``; the device named by its QOM path)
  while QEMU waits paused (``-S``) before the guest's first instruction, then ``cont`` (:mod:`vmm_qemu`): libvirt's
  ``<iotune>`` way. Not the ``throttle`` filter node: that one counts a discard as a write of all the bytes it
  frees (block/throttle.c), so one ``fstrim`` of a free filesystem would hold the guest's writes for minutes; the
  BlockBackend's buckets count reads and writes only. Burst: a tenth of a second's worth (QEMU's default without
  ``*_max``; docs/throttle.txt).
* Root disk growth (``rootDisk.sizeMiB``): ``block_resize`` of the root format node (``node-name root``) over QMP
  while QEMU waits paused, the same way; it grows a raw file (ftruncate on QEMU's own descriptor, so after
  ``-runas`` too), a qcow2's virtual size, or an RBD image (librbd's resize). The guest reads the disk's size when
  its virtio-blk driver probes, so it boots on the grown disk; its root file system grows at boot
  (docs/guest-image.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

from zjusct_launcher.capability import Profile
from zjusct_launcher.config import IoLimits, LauncherConfig
from zjusct_launcher.paths import RuntimePaths

DEFAULT_BINARY = "qemu-system-x86_64"
# QEMU drops privileges itself (-runas), so it has no jailer.
PROFILE = Profile(type="qemu", default_binary=DEFAULT_BINARY, lacks={"jailer": ""})
# Fixed PCI slots keep the disk order stable: vda = root (0x3), vdb = config disk (0x4), eth0 (0x5).
ROOT_ADDR, IDENTITY_ADDR, NET_ADDR = "0x3", "0x4", "0x5"
ROOT_DEVICE_ID = "root-disk"  # the root virtio-blk-pci device's qdev id
# What block_set_io_throttle names: the virtio-blk device inside that PCI proxy, which holds the BlockBackend (the
# proxy's own id is refused, "Device does not have a block device backend"; QEMU 7.2, measured).
ROOT_BLOCK_BACKEND = f"/machine/peripheral/{ROOT_DEVICE_ID}/virtio-backend"
RBD_SECRET_ID = "rbdkey0"  # noqa: S105 - an object id, not a secret
# The q35 machine without the chipset devices a headless virtio guest never uses (QEMU 7.2 ``-machine q35,help``):
# the ICH9 AHCI controller (``sata``), the SMBus controller (``smbus``), the PS/2 keyboard and mouse controller
# (``i8042``) and VMware's I/O port (``vmport``). Fewer emulated devices to attack, and fewer drivers for the
# guest to load at boot (ahci, libata, scsi_mod, i2c_i801, psmouse, serio_raw): a cheaper TCG boot, measured by
# bench/guest_boot.py --machine (docs/benchmarks.md). Power-off stays ACPI (system_powerdown); reboot and panic
# end QEMU as before.
MACHINE = "q35,sata=off,smbus=off,i8042=off,vmport=off"


SANDBOX_BASE = "on,obsolete=deny,spawn=deny,resourcecontrol=deny"


def sandbox_args(cfg: LauncherConfig) -> list[str]:
    """``-sandbox`` (when hypervisor.seccomp) and ``-runas uid:gid`` (when hypervisor.runAs) arguments."""
    hyp = cfg.hypervisor
    args: list[str] = []
    if hyp.seccomp:
        args += ["-sandbox", SANDBOX_BASE if hyp.run_as is not None else SANDBOX_BASE + ",elevateprivileges=deny"]
    if hyp.run_as is not None:
        args += ["-runas", f"{hyp.run_as.uid}:{hyp.run_as.gid}"]
    return args


def opt_escape(value: str) -> str:
    return value.replace(",", ",,")


def _cache(mode: str) -> dict[str, bool]:
    return {"direct": mode == "None", "no-flush": False}


def root_blockdev(cfg: LauncherConfig, paths: RuntimePaths, is_block_device: bool) -> dict[str, Any]:
    cache = _cache(cfg.root_disk.cache)
    if cfg.root_disk.rbd is not None:
        rbd = cfg.root_disk.rbd
        proto: dict[str, Any] = {"driver": "rbd", "pool": rbd.pool, "image": rbd.image, "conf": rbd.conf,
                                 "user": rbd.user, "cache": cache}
        if rbd.keyring_path:
            proto["key-secret"] = RBD_SECRET_ID
            proto["auth-client-required"] = ["cephx"]
    else:
        proto = {"driver": "host_device" if is_block_device else "file", "filename": cfg.root_disk.path,
                 "cache": cache}
    # rootDisk.format: raw, or qcow2 (no "backing" given: QEMU opens the backing file named in the image's header,
    # read-only, with its image locking shared among the VMs reading it)
    return {"driver": cfg.root_disk.format, "node-name": "root", "cache": cache, "discard": "unmap", "file": proto}


def io_throttle(limits: IoLimits) -> dict[str, Any] | None:
    """The ``block_set_io_throttle`` arguments of the root device for ``rootDisk.ioLimits`` (0: no limit of that
    kind, as QMP has it), or None when nothing is limited."""
    if not limits.any():
        return None
    return {"id": ROOT_BLOCK_BACKEND, "bps": 0, "bps_rd": limits.read_bytes_per_second or 0,
            "bps_wr": limits.write_bytes_per_second or 0, "iops": 0, "iops_rd": limits.read_iops or 0,
            "iops_wr": limits.write_iops or 0}


def paused_start(cfg: LauncherConfig) -> bool:
    """True when QEMU starts paused (``-S``) for the launcher's QMP steps before the guest's first instruction
    (:meth:`vmm_qemu.QemuVmm.attach`): the root disk's ``ioLimits`` or ``sizeMiB``."""
    return cfg.root_disk.io_limits.any() or cfg.root_disk.size_mib is not None


def root_resize(block_devices: list[dict[str, Any]], size_mib: int) -> tuple[int, dict[str, Any] | None]:
    """The root disk's size and the ``block_resize`` arguments that grow it to ``size_mib`` MiB.

    Args:
        block_devices: QMP ``query-block``'s answer (the root disk is the entry whose ``inserted.node-name`` is
            ``root``, :func:`root_blockdev`).
        size_mib: the size asked (``rootDisk.sizeMiB``).

    Returns:
        ``(current size in bytes, arguments)``; the arguments are None when the disk is already that size or larger
        (a disk is never shrunk).

    Raises:
        ValueError: no root disk, or no ``virtual-size``, in the answer.
    """
    for dev in block_devices:
        inserted = dev.get("inserted") or {}
        if inserted.get("node-name") == "root":
            current = (inserted.get("image") or {}).get("virtual-size")
            if not isinstance(current, int):
                raise ValueError("query-block gives no virtual-size of the root disk")
            wanted = size_mib * 1048576
            return current, ({"node-name": "root", "size": wanted} if current < wanted else None)
    raise ValueError("query-block lists no root disk (node-name root)")


def serial_chardev(cfg: LauncherConfig) -> list[str]:
    """The ``-chardev`` of the guest's serial port (``serial0``).

    Without ``serialConsole``: a file, ``serialLogPath``, appended. With it: a listening unix socket at
    ``serialConsole.socketPath`` (``server=on,wait=off``: the guest runs whether or not anyone is attached, and
    QEMU serves one client at a time) that still appends everything the guest writes to ``serialLogPath``
    (``logfile``, ``logappend``), attached or not: the panic check and the operator's log read the same file.
    """
    log = opt_escape(cfg.serial_log_path)
    if cfg.serial_console is None:
        return ["-chardev", f"file,id=serial0,path={log},append=on"]
    return ["-chardev", f"socket,id=serial0,path={opt_escape(cfg.serial_console.socket_path)},server=on,wait=off,"
                        f"logfile={log},logappend=on"]


def build_argv(cfg: LauncherConfig, binary: str, accel: str, paths: RuntimePaths,
               root_is_block_device: bool = False) -> list[str]:
    """The QEMU argument list for one boot.

    Args:
        accel: ``kvm`` or ``tcg`` (the decision, never ``auto``).
        root_is_block_device: rootDisk.path is a block device (host_device driver) rather than a file.
    """
    m = cfg.machine
    argv = [binary, "-name", f"{cfg.vm.namespace}_{cfg.vm.name}", "-M", MACHINE]
    if accel == "kvm":
        argv += ["-accel", "kvm", "-cpu", "host"]
    else:
        argv += ["-accel", f"tcg,tb-size={cfg.hypervisor.tcg_translation_cache_mib}",
                 "-cpu", cfg.hypervisor.tcg_cpu_model]
    argv += ["-smp", str(m.vcpus), "-m", f"{m.memory_mib}M",
             "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
             "-action", "panic=shutdown", "-device", "pvpanic",
             *serial_chardev(cfg), "-serial", "chardev:serial0",
             "-qmp", f"unix:{opt_escape(paths.qmp_socket)},server=on,wait=off",
             "-kernel", cfg.boot.kernel, *sandbox_args(cfg)]
    if cfg.boot.initrd:
        argv += ["-initrd", cfg.boot.initrd]
    argv += ["-append", cfg.boot.cmdline]
    if cfg.root_disk.rbd is not None and cfg.root_disk.rbd.keyring_path:
        argv += ["-object", f"secret,id={RBD_SECRET_ID},file={opt_escape(paths.rbd_secret)},format=base64"]
    argv += ["-blockdev", json.dumps(root_blockdev(cfg, paths, root_is_block_device), separators=(",", ":"))]
    root_device = f"virtio-blk-pci,drive=root,bus=pcie.0,addr={ROOT_ADDR}"
    if paused_start(cfg):
        # paused until the launcher has grown the disk / set the limits over QMP (vmm_qemu.QemuVmm.attach), then
        # ``cont``
        argv += ["-S"]
        root_device += f",id={ROOT_DEVICE_ID}"
    argv += ["-device", root_device]
    identity = {"driver": "raw", "node-name": "identity", "read-only": True,
                "file": {"driver": "file", "filename": paths.identity_disk, "read-only": True}}
    argv += ["-blockdev", json.dumps(identity, separators=(",", ":")),
             "-device", f"virtio-blk-pci,drive=identity,bus=pcie.0,addr={IDENTITY_ADDR}"]
    net = cfg.network
    if net.mode != "none":
        if net.mode == "tap":
            argv += ["-netdev", f"tap,id=net0,ifname={net.tap},script=no,downscript=no"]
        else:
            argv += ["-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{net.host_forward_port}-:22"]
        device = f"virtio-net-pci,netdev=net0,bus=pcie.0,addr={NET_ADDR}"
        if net.mac:
            device += f",mac={net.mac}"
        argv += ["-device", device]
    return argv


_KEY_RE = re.compile(r"^\s*key\s*=\s*(\S+)\s*$")


def keyring_key(keyring_text: str, user: str) -> str:
    """The base64 key of ``[client.<user>]`` in a Ceph keyring (INI-like: ``key = AQ...``).

    Raises ValueError (naming the section, never the key) when absent.
    """
    wanted = f"[client.{user}]"
    section = None
    for line in keyring_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
            continue
        if section == wanted:
            match = _KEY_RE.match(line)
            if match:
                return match.group(1)
    raise ValueError(f"no 'key = ...' line in section {wanted}")
