"""Firecracker's pure half: its profile, the JSON config for ``--config-file``, the command lines (direct and under
the jailer) and the exit-code meaning. The run's effects are :mod:`vmm_firecracker`; the API client
(``PUT /actions {"action_type": "SendCtrlAltDel"}``) is :mod:`firecracker_api`.

Facts from Firecracker's API specification (firecracker.yaml) and docs (api_requests/actions.md):
boot-source {kernel_image_path, boot_args, initrd_path}; drives [{drive_id, path_on_host, is_root_device,
is_read_only, cache_type: Unsafe|Writeback}]; network-interfaces [{iface_id, guest_mac, host_dev_name}];
machine-config {vcpu_count, mem_size_mib, smt}. The guest console is the process's stdout. Firecracker exits when
the guest resets (``reboot=k``: the i8042 reset line), with status 0; SendCtrlAltDel needs the guest's i8042
driver. Exit statuses: 0 Ok, 1 generic error, 2 unexpected error, 3 bad configuration, 4 argument parsing,
148 bad syscall (seccomp), larger values: fatal signals caught by Firecracker.

The jailer (docs/jailer.md): ``jailer --id ID --exec-file FC --uid U --gid G --chroot-base-dir B
[--cgroup-version 2] [--cgroup FILE=VALUE]... -- <firecracker args>`` builds ``<B>/<basename FC>/<ID>/root``, copies
FC into it, creates ``/dev/kvm`` and ``/dev/net/tun`` there, joins the cgroups, chroots, drops to U:G and execs
Firecracker with ``--id ID`` added; Firecracker's paths are then inside the chroot and it opens them as U:G. So the
launcher puts the kernel, initrd, config disk and config file into the chroot beforehand (copies, owned by U:G,
read-only) and the root disk as a hard link (the same inode; chowned to U:G for the run, restored afterwards).
Firecracker's own seccomp filter is on unless ``--no-seccomp``.

Not run against a release binary here: no Firecracker or jailer binary is installable on these machines (no KVM
either); the tests use stand-ins that speak the documented surface.
"""

from __future__ import annotations

import os
from typing import Any

from zjusct_launcher import names
from zjusct_launcher.capability import Profile
from zjusct_launcher.config import IoLimits, LauncherConfig
from zjusct_launcher.paths import RuntimePaths

DEFAULT_BINARY = "firecracker"
PROFILE = Profile(
    type="firecracker", default_binary=DEFAULT_BINARY,
    lacks={"tcg": "it needs KVM", "userNetwork": "", "rbd": "Firecracker has no librbd", "directIO": "",
           "qcow2": "Firecracker opens raw files only",
           "serialConsole": "its serial console is the VMM's standard input and output, which only the launcher holds"},
    kernel_magic=b"\x7fELF", kernel_refusal="is not an uncompressed ELF vmlinux (Firecracker cannot boot a bzImage)")
# Boot args Firecracker guests need: reset through the keyboard controller, no PCI probing, fast i8042 probe.
EXTRA_BOOT_ARGS = "reboot=k pci=off i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd"
EXIT_MEANINGS = {0: "ok", 1: "generic error", 2: "unexpected error", 3: "bad configuration",
                 4: "argument parsing error", 148: "bad syscall (seccomp)"}


# Paths inside the jailer's chroot.
JAIL_KERNEL, JAIL_INITRD, JAIL_ROOTFS, JAIL_IDENTITY = "/vmlinux", "/initrd.img", "/rootfs.raw", "/identity.tar"
JAIL_CONFIG, JAIL_API_SOCKET = "/firecracker.json", "/run/firecracker.socket"
CPU_PERIOD_US = 100000  # cgroup v2 cpu.max "<quota> <period>": quota = vCPUs x period


def jail_root(cfg: LauncherConfig, binary: str) -> str:
    """The jailer's chroot directory ``<chrootBaseDir>/<basename binary>/<id>/root`` (needs hypervisor.jailer)."""
    jailer = cfg.hypervisor.jailer
    if jailer is None:
        raise ValueError("hypervisor.jailer is not set")
    return os.path.join(jailer.chroot_base_dir, os.path.basename(binary), instance_id(cfg), "root")


def rate_limiter(limits: IoLimits) -> dict[str, Any]:
    """The root drive's ``rate_limiter`` for ``rootDisk.ioLimits`` (empty: none).

    Firecracker's limiter has one token bucket of bytes and one of operations per drive, shared by reads and
    writes (its API's RateLimiter: ``size`` tokens refilled every ``refill_time`` ms), so each bucket takes the
    smaller of the read and write limits: never more than either limit allows (docs/launcher-protocol.md).
    """
    out: dict[str, Any] = {}
    for bucket, values in (("bandwidth", (limits.read_bytes_per_second, limits.write_bytes_per_second)),
                           ("ops", (limits.read_iops, limits.write_iops))):
        given = [v for v in values if v is not None]
        if given:
            out[bucket] = {"size": min(given), "refill_time": 1000}
    return out


def build_config(cfg: LauncherConfig, paths: RuntimePaths, jailed: bool = False) -> dict[str, Any]:
    """The ``--config-file`` document; ``jailed``: with the chroot paths (JAIL_*) instead of the host's."""
    boot: dict[str, Any] = {"kernel_image_path": JAIL_KERNEL if jailed else cfg.boot.kernel,
                            "boot_args": (cfg.boot.cmdline + " " + EXTRA_BOOT_ARGS).strip()}
    if cfg.boot.initrd:
        boot["initrd_path"] = JAIL_INITRD if jailed else cfg.boot.initrd
    drives: list[dict[str, Any]] = [
        {"drive_id": "rootfs", "path_on_host": JAIL_ROOTFS if jailed else cfg.root_disk.path,
         "is_root_device": True, "is_read_only": False, "cache_type": "Writeback"},
        {"drive_id": "identity", "path_on_host": JAIL_IDENTITY if jailed else paths.identity_disk,
         "is_root_device": False, "is_read_only": True, "cache_type": "Writeback"},
    ]
    limiter = rate_limiter(cfg.root_disk.io_limits)
    if limiter:
        drives[0]["rate_limiter"] = limiter
    doc: dict[str, Any] = {
        "boot-source": boot,
        "drives": drives,
        "machine-config": {"vcpu_count": cfg.machine.vcpus, "mem_size_mib": cfg.machine.memory_mib,
                           "smt": False},
        "network-interfaces": [],
    }
    if cfg.network.mode == "tap":
        doc["network-interfaces"].append({"iface_id": "eth0", "guest_mac": cfg.network.mac,
                                          "host_dev_name": cfg.network.tap})
    return doc


def instance_id(cfg: LauncherConfig) -> str:
    """Firecracker ``--id``: 1-64 of alphanumerics and '-' (names.firecracker_id of ``<namespace>-<name>``)."""
    return names.firecracker_id(f"{cfg.vm.namespace}-{cfg.vm.name}")


def build_argv(cfg: LauncherConfig, binary: str, paths: RuntimePaths) -> list[str]:
    """Firecracker run directly (no hypervisor.runAs): as the launcher's user, with its own seccomp filter."""
    argv = [binary, "--api-sock", paths.fc_socket, "--config-file", paths.fc_config, "--id", instance_id(cfg)]
    return argv if cfg.hypervisor.seccomp else [*argv, "--no-seccomp"]


def build_jailer_argv(cfg: LauncherConfig, jailer: str, binary: str) -> list[str]:
    """The jailer's argument list: uid/gid from hypervisor.runAs, the chroot base from hypervisor.jailer, a
    cgroup v2 CPU limit of machine.vcpus CPUs; Firecracker's own arguments (after ``--``) name chroot paths."""
    run_as, jail = cfg.hypervisor.run_as, cfg.hypervisor.jailer
    if run_as is None or jail is None:
        raise ValueError("hypervisor.runAs and hypervisor.jailer are both required for the jailer")
    argv = [jailer, "--id", instance_id(cfg), "--exec-file", binary, "--uid", str(run_as.uid),
            "--gid", str(run_as.gid), "--chroot-base-dir", jail.chroot_base_dir, "--cgroup-version", "2",
            "--cgroup", f"cpu.max={cfg.machine.vcpus * CPU_PERIOD_US} {CPU_PERIOD_US}",
            "--", "--api-sock", JAIL_API_SOCKET, "--config-file", JAIL_CONFIG]
    return argv if cfg.hypervisor.seccomp else [*argv, "--no-seccomp"]


def describe_exit(status: int) -> str:
    return EXIT_MEANINGS.get(status, "fatal signal caught by firecracker" if status > 148 else "unknown")
