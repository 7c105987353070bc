"""LauncherConfig v1: parse and validate a config document into plain dataclasses.

Pure: nothing here touches the system (the read-only checks of the files a config names are
:func:`environment.environment_problems`). Every problem is reported, each naming its JSON path, the value and the
allowed range: ``machine.memoryMiB: 8192 is above the maximum 4096``. The JSON Schema in
``schemas/launcher-config-v1.json`` describes the same structural rules; the cross-field rules it cannot express are
marked "semantic" in docs/launcher-protocol.md (gateway inside the IPv4 subnet, unicast MAC, kernel command line
length). What a config asks of its VMM is checked against the VMM's profile (:mod:`capability`): a capability it
lacks is a problem naming the field.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from zjusct_launcher import API_VERSION, capability, names

KIND = "LauncherConfig"

# Bounds fixed by the contract (notes/CONTRACT-guest.md) and by the kernel.
VCPUS = (1, 4)
MEMORY_MIB = (128, 4096)
BOOT_ID = (0, 2**31 - 1)
KVM_PROBE_TIMEOUT_SECONDS = (1, 60)
TCG_TB_MIB = (16, 2048)
# QEMU's -cpu under TCG: the baseline x86-64 model plus RDRAND, which early-boot entropy needs (getrandom() for
# sshd's host keys). Measured (bench/guest_boot.py --cpu, docs/benchmarks.md): a Debian guest reaches SSH 8-20 %
# sooner than with "max", whose AVX2/SSE4.2 code paths in glibc TCG emulates slowly ("Nehalem" is slower still).
TCG_CPU_MODEL = "qemu64,+rdrand"
CPU_MODEL_RE = re.compile(r"^[A-Za-z0-9_.-]+(,[+-]?[A-Za-z0-9_.-]+(=[A-Za-z0-9_.-]+)?)*$")
READINESS_TIMEOUT_SECONDS = (1, 3600)
STOP_TIMEOUT_SECONDS = (1, 3600)
# How often a stop repeats its graceful request (0: once). A guest whose init does not handle the ACPI power button
# or Ctrl-Alt-Del yet (still booting: logind not started) drops the first one; OpenStack Nova resends for the same
# reason (its shutdown_retry_interval, 10 s). At least 1 s apart: systemd turns more than 7 Ctrl-Alt-Dels within 2 s
# into a forced reboot (CtrlAltDelBurstAction, systemd-system.conf(5)).
STOP_RETRY_INTERVAL_SECONDS = (0, 3600)
STOP_RETRY_INTERVAL_DEFAULT = 10
BOOT_SLOTS = (1, 1024)
PORT = (1, 65535)
# A VMM's uid/gid: never 0 (root), never 4294967295 ((uid_t)-1, "no change" to setresuid/chown).
RUN_AS_ID = (1, 2**32 - 2)
# arch/x86/include/asm/setup.h: COMMAND_LINE_SIZE 2048 (incl. NUL); the launcher appends <= 128 bytes.
CMDLINE_MAX = 1900
# sockaddr_un.sun_path is 108 bytes incl. NUL (unix(7)); the longest socket name we add is "/qmp.sock".
RUNTIME_DIR_MAX = 96
SOCKET_PATH_MAX = 107
# serialConsole.uid/gid: the owner of the console socket; 0 (root) is allowed, (uid_t)-1 ("no change") is not.
CONSOLE_ID = (0, 2**32 - 2)
# serialConsole.socketPath: the characters a gateway's forced command line carries unquoted (network.gateway)
CONSOLE_PATH_RE = re.compile(r"^/[A-Za-z0-9_./-]+$")
# linux/if.h IFNAMSIZ 16 incl. NUL.
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
CEPH_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# rootDisk.ioLimits: bytes/s and requests/s, the CloudVM's spec.diskIO ranges (model.spec.DISK_IO; tests/unit/cloudvm/
# test_crd_matches_spec_rules.py holds the two equal)
IO_BYTES_PER_SECOND = (1048576, 1099511627776)
IO_OPS_PER_SECOND = (20, 10000000)
IO_LIMIT_FIELDS = {"readBytesPerSecond": IO_BYTES_PER_SECOND, "writeBytesPerSecond": IO_BYTES_PER_SECOND,
                   "readIOPS": IO_OPS_PER_SECOND, "writeIOPS": IO_OPS_PER_SECOND}
ROOT_FORMATS = ("raw", "qcow2")  # rootDisk.format: QEMU block format drivers of the root disk file
# rootDisk.sizeMiB: the CloudVM's spec.rootVolumeSizeMiB range (model.spec.ROOT_VOLUME_SIZE_MIB; held equal by
# tests/unit/cloudvm/test_crd_matches_spec_rules.py): 1 MiB to 16 TiB
ROOT_SIZE_MIB = (1, 16777216)
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
MAX_SSH_KEYS = 64
MAX_SSH_KEY_LEN = 16384


@dataclass(frozen=True)
class VMRef:
    namespace: str
    name: str
    uid: str
    boot_id: int

    def as_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid, "bootID": self.boot_id}


@dataclass(frozen=True)
class Machine:
    vcpus: int
    memory_mib: int


@dataclass(frozen=True)
class Boot:
    kernel: str
    initrd: str | None
    cmdline: str


@dataclass(frozen=True)
class RbdSource:
    pool: str
    image: str
    conf: str
    user: str
    keyring_path: str | None


@dataclass(frozen=True)
class IoLimits:
    """``rootDisk.ioLimits``: what the VMM lets the guest do on its root disk, each None for no limit."""

    read_bytes_per_second: int | None = None
    write_bytes_per_second: int | None = None
    read_iops: int | None = None
    write_iops: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.read_bytes_per_second, self.write_bytes_per_second,
                                           self.read_iops, self.write_iops))


@dataclass(frozen=True)
class RootDisk:
    path: str | None
    rbd: RbdSource | None
    cache: str  # "Writeback" | "None"
    format: str = "raw"  # of the file at path: "raw" | "qcow2" (QEMU opens a qcow2's backing file itself)
    io_limits: IoLimits = field(default_factory=IoLimits)
    size_mib: int | None = None  # grow the disk to this size (MiB) before the guest runs; never shrunk; None: as is


@dataclass(frozen=True)
class Identity:
    hostname: str
    instance_id: str
    ssh_authorized_keys: tuple[str, ...]


@dataclass(frozen=True)
class Network:
    mode: str  # "tap" | "user" | "none"
    tap: str | None = None
    create_tap: bool = False
    bridge: str | None = None
    mac: str | None = None
    ipv4: str | None = None  # CIDR
    gateway: str | None = None
    dns: tuple[str, ...] = ()
    host_forward_port: int | None = None


@dataclass(frozen=True)
class RunAs:
    """The unprivileged uid/gid the VMM drops to (QEMU ``-runas uid:gid``; Firecracker's jailer)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class Jailer:
    """Firecracker's jailer: its binary (None: ``jailer`` in PATH) and the chroot base directory."""

    binary: str | None
    chroot_base_dir: str


@dataclass(frozen=True)
class Hypervisor:
    type: str  # "qemu" | "firecracker"
    accel: str = "auto"
    allow_tcg: bool = True
    binary: str | None = None
    kvm_probe_timeout_seconds: int = 5
    tcg_translation_cache_mib: int = 256
    tcg_cpu_model: str = TCG_CPU_MODEL
    run_as: RunAs | None = None
    seccomp: bool = True
    jailer: Jailer | None = None


@dataclass(frozen=True)
class Readiness:
    host: str
    port: int
    timeout_seconds: int


@dataclass(frozen=True)
class BootSlots:
    """At most ``count`` guests of this host boot at once: each launcher holds one ``<directory>/slot-<i>.lock``
    (flock) from just before it starts the VMM until the guest is ready (docs/launcher-protocol.md)."""

    directory: str
    count: int


@dataclass(frozen=True)
class SerialConsole:
    """``serialConsole``: the guest's serial console on a unix socket (docs/launcher-protocol.md, "Serial console").

    Attributes:
        socket_path: the socket's absolute path (at most :data:`SOCKET_PATH_MAX` bytes); its directory must be
            root's and writable by nobody else (checked when the socket is handed over).
        uid, gid: the socket's owner once the VMM has made it (mode 0600): who may attach besides root.
    """

    socket_path: str
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class LauncherConfig:
    vm: VMRef
    machine: Machine
    boot: Boot
    root_disk: RootDisk
    identity: Identity
    network: Network
    hypervisor: Hypervisor
    readiness: Readiness | None
    stop_timeout_seconds: int
    runtime_dir: str
    serial_log_path: str
    result_path: str
    termination_message_path: str | None
    ready_marker_path: str
    boot_slots: BootSlots | None = None
    stop_retry_interval_seconds: int = STOP_RETRY_INTERVAL_DEFAULT
    serial_console: SerialConsole | None = None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)


class ConfigError(Exception):
    """The config is invalid; ``problems`` lists every problem, one sentence each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


_MISSING = object()


def _show(value: Any) -> str:
    if isinstance(value, str):
        text = value if len(value) <= 80 else value[:77] + "..."
        return '"' + text.replace('"', '\\"') + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    return str(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class _Checker:
    """Collects problems while reading a JSON document. Each getter returns a usable default on error."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def obj(self, path: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.bad(path, f"expected an object, got {_type_name(value)}")
            return {}
        for key in value:
            if key not in allowed:
                self.bad(f"{path}.{key}" if path else key, f"unknown field (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                self.bad(f"{path}.{key}" if path else key, "required field is missing")
        return value

    def get(self, parent: dict[str, Any], path: str, key: str, default: Any = _MISSING) -> Any:
        value = parent.get(key, _MISSING)
        if value is _MISSING:
            return default
        return value

    def string(self, path: str, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = "",
               max_len: int = 4096, allow_empty: bool = False) -> str:
        if not isinstance(value, str):
            self.bad(path, f"expected a string, got {_type_name(value)}")
            return ""
        if not value and not allow_empty:
            self.bad(path, "must not be empty")
            return ""
        if len(value) > max_len:
            self.bad(path, f"is {len(value)} characters long, above the maximum {max_len}")
            return value
        if pattern is not None and value and not pattern.match(value):
            self.bad(path, f"{_show(value)} is not {what}")
        elif any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            self.bad(path, f"{_show(value)} contains control characters")
        return value

    def integer(self, path: str, value: Any, bounds: tuple[int, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(path, f"expected an integer, got {_type_name(value)} {_show(value)}")
            return bounds[0]
        if value < bounds[0]:
            self.bad(path, f"{value} is below the minimum {bounds[0]}")
        elif value > bounds[1]:
            self.bad(path, f"{value} is above the maximum {bounds[1]}")
        return value

    def boolean(self, path: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.bad(path, f"expected a boolean, got {_type_name(value)} {_show(value)}")
            return False
        return value

    def enum(self, path: str, value: Any, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            self.bad(path, f"{_show(value)} is not one of {', '.join(choices)}")
            return choices[0]
        return value

    def abs_path(self, path: str, value: Any) -> str:
        text = self.string(path, value, max_len=1024)
        if not text:
            return text
        if not text.startswith("/"):
            self.bad(path, f"{_show(text)} is not an absolute path")
        elif os.path.normpath(text) != text and os.path.normpath(text) != text.rstrip("/"):
            self.bad(path, f"{_show(text)} is not a normalised path (no '.', '..' or '//' components)")
        elif "\x00" in text:
            self.bad(path, "contains a NUL byte")
        return text

    def optional(self, path: str, value: Any, reader: Callable[[str, Any], Any]) -> Any:
        return None if value is None else reader(path, value)


def _ipv4(c: _Checker, path: str, value: Any) -> str:
    text = c.string(path, value, max_len=15)
    if text:
        try:
            ipaddress.IPv4Address(text)
        except ValueError:
            c.bad(path, f"{_show(text)} is not an IPv4 address")
    return text


def _mac(c: _Checker, path: str, value: Any) -> str:
    text = c.string(path, value, pattern=MAC_RE, what="a MAC address like 52:54:00:12:34:56", max_len=17)
    if text and MAC_RE.match(text) and int(text[:2], 16) & 1:
        c.bad(path, f"{_show(text)} is a multicast address (the first octet must be even)")
    return text.lower()


def _ask(c: _Checker, vmm_type: str, name: str, value: str = "") -> None:
    """The config asks its VMM for capability ``name`` (``value``: what was typed, shown): a problem naming the field
    when the VMM's profile lacks it (:func:`capability.refusal`)."""
    refused = capability.refusal(vmm_type, name, value)
    if refused is not None:
        c.bad(*refused)


def _parse_vm(c: _Checker, raw: Any) -> VMRef:
    d = c.obj("vm", raw, ("namespace", "name", "uid", "bootID"), ("namespace", "name", "uid", "bootID"))
    ns = c.string("vm.namespace", d.get("namespace", ""), pattern=DNS_LABEL_RE, max_len=63,
                  what="a DNS-1123 label (lower-case letters, digits, '-', at most 63)")
    name = c.string("vm.name", d.get("name", ""), pattern=DNS_SUBDOMAIN_RE, max_len=253,
                    what="a DNS-1123 subdomain (lower-case letters, digits, '-', '.')")
    uid = c.string("vm.uid", d.get("uid", ""), pattern=UUID_RE, what="a UUID", max_len=36)
    boot_id = c.integer("vm.bootID", d.get("bootID", 0), BOOT_ID) if "bootID" in d else 0
    return VMRef(ns, name, uid, boot_id)


def _parse_machine(c: _Checker, raw: Any) -> Machine:
    d = c.obj("machine", raw, ("vcpus", "memoryMiB"), ("vcpus", "memoryMiB"))
    vcpus = c.integer("machine.vcpus", d["vcpus"], VCPUS) if "vcpus" in d else 1
    mem = c.integer("machine.memoryMiB", d["memoryMiB"], MEMORY_MIB) if "memoryMiB" in d else 128
    return Machine(vcpus, mem)


def _parse_boot(c: _Checker, raw: Any) -> Boot:
    d = c.obj("boot", raw, ("kernel", "initrd", "cmdline"), ("kernel", "cmdline"))
    kernel = c.abs_path("boot.kernel", d["kernel"]) if "kernel" in d else ""
    initrd = c.optional("boot.initrd", d.get("initrd"), c.abs_path)
    cmdline = ""
    if "cmdline" in d:
        cmdline = c.string("boot.cmdline", d["cmdline"], max_len=CMDLINE_MAX, allow_empty=True)
    return Boot(kernel, initrd, cmdline)


def _parse_root_disk(c: _Checker, raw: Any) -> RootDisk:
    d = c.obj("rootDisk", raw, ("path", "rbd", "cache", "format", "ioLimits", "sizeMiB"), ())
    has_path, has_rbd = "path" in d, "rbd" in d
    if isinstance(raw, dict) and has_path == has_rbd:
        c.bad("rootDisk", "exactly one of path or rbd must be given" if has_path else
              "one of path or rbd is required")
    path = c.abs_path("rootDisk.path", d["path"]) if has_path else None
    rbd = None
    if has_rbd:
        r = c.obj("rootDisk.rbd", d["rbd"], ("pool", "image", "conf", "user", "keyringPath"),
                  ("pool", "image", "conf", "user"))
        what = "a Ceph name (letters, digits, '_', '.', '-')"
        rbd = RbdSource(
            pool=c.string("rootDisk.rbd.pool", r.get("pool", ""), pattern=CEPH_NAME_RE, what=what, max_len=128),
            image=c.string("rootDisk.rbd.image", r.get("image", ""), pattern=CEPH_NAME_RE, what=what, max_len=128),
            conf=c.abs_path("rootDisk.rbd.conf", r["conf"]) if "conf" in r else "",
            user=c.string("rootDisk.rbd.user", r.get("user", ""), pattern=CEPH_NAME_RE, what=what, max_len=128),
            keyring_path=c.optional("rootDisk.rbd.keyringPath", r.get("keyringPath"), c.abs_path),
        )
    cache = c.enum("rootDisk.cache", d.get("cache", "Writeback"), ("Writeback", "None"))
    fmt = c.enum("rootDisk.format", d.get("format", "raw"), ROOT_FORMATS)
    if fmt != "raw" and has_rbd:
        c.bad("rootDisk.format", f"{_show(fmt)} is only available with rootDisk.path (an RBD image is opened raw)")
    limits = IoLimits()
    if "ioLimits" in d:
        io = c.obj("rootDisk.ioLimits", d["ioLimits"], tuple(IO_LIMIT_FIELDS), ())
        got = {key: c.integer(f"rootDisk.ioLimits.{key}", io[key], bounds)
               for key, bounds in IO_LIMIT_FIELDS.items() if key in io}
        limits = IoLimits(got.get("readBytesPerSecond"), got.get("writeBytesPerSecond"), got.get("readIOPS"),
                          got.get("writeIOPS"))
    size_mib = c.integer("rootDisk.sizeMiB", d["sizeMiB"], ROOT_SIZE_MIB) if "sizeMiB" in d else None
    return RootDisk(path, rbd, cache, fmt, limits, size_mib)


def _parse_identity(c: _Checker, raw: Any, vm: VMRef) -> Identity:
    d = c.obj("identity", raw, ("hostname", "instanceID", "sshAuthorizedKeys"), ())
    default_hostname = names.dns_label(vm.name) if vm.name else "vm"
    hostname = c.string("identity.hostname", d.get("hostname", default_hostname), pattern=DNS_LABEL_RE, max_len=63,
                        what="a host name (DNS-1123 label)")
    instance_id = c.string("identity.instanceID", d.get("instanceID", vm.uid or "unset"), pattern=INSTANCE_ID_RE,
                           max_len=128, what="an instance id (letters, digits, '_', '.', ':', '/', '-')")
    keys_raw = d.get("sshAuthorizedKeys", [])
    keys: list[str] = []
    if not isinstance(keys_raw, list):
        c.bad("identity.sshAuthorizedKeys", f"expected an array, got {_type_name(keys_raw)}")
    elif len(keys_raw) > MAX_SSH_KEYS:
        c.bad("identity.sshAuthorizedKeys", f"has {len(keys_raw)} keys, above the maximum {MAX_SSH_KEYS}")
    else:
        for i, key in enumerate(keys_raw):
            p = f"identity.sshAuthorizedKeys[{i}]"
            text = c.string(p, key, max_len=MAX_SSH_KEY_LEN)
            if text and not re.match(r"^(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( .*)?$", text):
                c.bad(p, f"{_show(text)} is not an OpenSSH public key line (\"<type> <base64> [comment]\")")
            keys.append(text)
    return Identity(hostname, instance_id, tuple(keys))


def _parse_network(c: _Checker, raw: Any) -> Network:
    mode_fields = {
        "tap": ("mode", "tap", "createTap", "bridge", "mac", "ipv4", "gateway", "dns"),
        "user": ("mode", "hostForwardPort", "mac"),
        "none": ("mode",),
    }
    if not isinstance(raw, dict):
        c.bad("network", f"expected an object, got {_type_name(raw)}")
        return Network("none")
    mode = c.enum("network.mode", raw.get("mode"), ("tap", "user", "none")) if "mode" in raw else "none"
    if "mode" not in raw:
        c.bad("network.mode", "required field is missing")
    required = {"tap": ("mode", "tap", "mac"), "user": ("mode", "hostForwardPort"), "none": ("mode",)}[mode]
    d = c.obj("network", raw, mode_fields[mode], required)
    if mode == "none":
        return Network("none")
    mac = _mac(c, "network.mac", d["mac"]) if "mac" in d else None
    if mode == "user":
        port = c.integer("network.hostForwardPort", d["hostForwardPort"], (1024, 65535)) \
            if "hostForwardPort" in d else None
        return Network("user", mac=mac, host_forward_port=port)
    tap = c.string("network.tap", d.get("tap", ""), pattern=IFNAME_RE, max_len=15,
                   what="an interface name (1-15 of letters, digits, '_', '.', '-')")
    create = c.boolean("network.createTap", d.get("createTap", False))
    bridge = None
    if d.get("bridge") is not None:
        bridge = c.string("network.bridge", d["bridge"], pattern=IFNAME_RE, max_len=15, what="an interface name")
        if not create:
            c.bad("network.bridge", "is only used when createTap is true (the launcher attaches the TAP it creates)")
    ipv4 = gateway = None
    dns: list[str] = []
    if d.get("ipv4") not in (None, ""):
        ipv4 = c.string("network.ipv4", d["ipv4"], max_len=18)
        try:
            iface = ipaddress.IPv4Interface(ipv4)
            if iface.network.prefixlen < 8 or iface.network.prefixlen > 30:
                c.bad("network.ipv4", f"prefix /{iface.network.prefixlen} is outside /8../30")
            elif iface.ip in (iface.network.network_address, iface.network.broadcast_address):
                c.bad("network.ipv4", f"{_show(ipv4)} is the network or broadcast address of its subnet")
        except ValueError:
            c.bad("network.ipv4", f"{_show(ipv4)} is not an IPv4 address with prefix like 10.200.0.5/24")
            iface = None
        if "/" not in ipv4 and iface is not None:
            c.bad("network.ipv4", f"{_show(ipv4)} lacks the prefix length (e.g. /24)")
        if d.get("gateway") is not None:
            gateway = _ipv4(c, "network.gateway", d["gateway"])
            try:
                if iface is not None and ipaddress.IPv4Address(gateway) not in iface.network:
                    c.bad("network.gateway", f"{_show(gateway)} is outside the subnet {iface.network}")
            except ValueError:
                pass
    elif d.get("gateway") is not None:
        c.bad("network.gateway", "requires network.ipv4")
    dns_raw = d.get("dns", [])
    if dns_raw is None:
        dns_raw = []
    if not isinstance(dns_raw, list):
        c.bad("network.dns", f"expected an array, got {_type_name(dns_raw)}")
    elif len(dns_raw) > 3:
        c.bad("network.dns", f"has {len(dns_raw)} servers, above the maximum 3 (resolv.conf MAXNS)")
    else:
        dns = [_ipv4(c, f"network.dns[{i}]", x) for i, x in enumerate(dns_raw)]
    return Network("tap", tap=tap, create_tap=create, bridge=bridge, mac=mac, ipv4=ipv4, gateway=gateway,
                   dns=tuple(dns))


def _parse_run_as(c: _Checker, raw: Any) -> RunAs | None:
    if raw is None:
        return None
    d = c.obj("hypervisor.runAs", raw, ("uid", "gid"), ("uid", "gid"))
    uid = c.integer("hypervisor.runAs.uid", d["uid"], RUN_AS_ID) if "uid" in d else RUN_AS_ID[0]
    gid = c.integer("hypervisor.runAs.gid", d["gid"], RUN_AS_ID) if "gid" in d else RUN_AS_ID[0]
    return RunAs(uid, gid)


def _parse_jailer(c: _Checker, raw: Any) -> Jailer | None:
    if raw is None:
        return None
    d = c.obj("hypervisor.jailer", raw, ("binary", "chrootBaseDir"), ("chrootBaseDir",))
    binary = c.optional("hypervisor.jailer.binary", d.get("binary"), c.abs_path)
    base = c.abs_path("hypervisor.jailer.chrootBaseDir", d["chrootBaseDir"]) if "chrootBaseDir" in d else ""
    return Jailer(binary, base)


def _parse_hypervisor(c: _Checker, raw: Any) -> Hypervisor:
    d = c.obj("hypervisor", raw, ("type", "accel", "allowTCG", "binary", "kvmProbeTimeoutSeconds",
                                  "tcgTranslationCacheMiB", "tcgCPUModel", "runAs", "seccomp", "jailer"), ("type",))
    typ = c.enum("hypervisor.type", d["type"], capability.VMM_TYPES) if "type" in d else "qemu"
    accel = c.enum("hypervisor.accel", d.get("accel", "auto"), ("auto", "kvm", "tcg"))
    allow = c.boolean("hypervisor.allowTCG", d.get("allowTCG", True))
    binary = c.optional("hypervisor.binary", d.get("binary"), c.abs_path)
    probe = c.integer("hypervisor.kvmProbeTimeoutSeconds", d.get("kvmProbeTimeoutSeconds", 5),
                      KVM_PROBE_TIMEOUT_SECONDS)
    tb = c.integer("hypervisor.tcgTranslationCacheMiB", d.get("tcgTranslationCacheMiB", 256), TCG_TB_MIB)
    cpu_model = c.string("hypervisor.tcgCPUModel", d.get("tcgCPUModel", TCG_CPU_MODEL), pattern=CPU_MODEL_RE,
                         what="a QEMU CPU model with optional ,+feature / ,-feature / ,prop=value", max_len=256)
    if accel == "tcg":
        _ask(c, typ, "tcg", _show(accel))
    if accel == "tcg" and not allow:
        c.bad("hypervisor.accel", '"tcg" contradicts hypervisor.allowTCG: false')
    run_as = _parse_run_as(c, d.get("runAs"))
    seccomp = c.boolean("hypervisor.seccomp", d.get("seccomp", True))
    jailer = _parse_jailer(c, d.get("jailer"))
    if jailer is not None:
        _ask(c, typ, "jailer")
    if typ == "firecracker" and run_as is not None and jailer is None:
        c.bad("hypervisor.jailer", "is required with hypervisor.runAs when hypervisor.type is firecracker "
                                   "(Firecracker drops privileges only through its jailer)")
    if typ == "firecracker" and jailer is not None and run_as is None:
        c.bad("hypervisor.runAs", "is required with hypervisor.jailer (the jailer needs a uid and a gid)")
    return Hypervisor(typ, accel, allow, binary, probe, tb, cpu_model, run_as, seccomp, jailer)


def _parse_readiness(c: _Checker, raw: Any, net: Network) -> Readiness | None:
    if raw is None:
        return None
    d = c.obj("readiness", raw, ("host", "port", "timeoutSeconds"), ())
    default_host, default_port = "", 22
    if net.mode == "user":
        default_host, default_port = "127.0.0.1", net.host_forward_port or 22
    elif net.mode == "tap" and net.ipv4:
        default_host = net.ipv4.split("/")[0]
    host = _ipv4(c, "readiness.host", d["host"]) if "host" in d else default_host
    if not host and "host" not in d:
        c.bad("readiness.host", "required field is missing (no guest IPv4 to default to)")
    port = c.integer("readiness.port", d["port"], PORT) if "port" in d else default_port
    timeout = c.integer("readiness.timeoutSeconds", d.get("timeoutSeconds", 300), READINESS_TIMEOUT_SECONDS)
    return Readiness(host, port, timeout)


def _parse_boot_slots(c: _Checker, raw: Any) -> BootSlots | None:
    if raw is None:
        return None
    d = c.obj("bootSlots", raw, ("directory", "count"), ("directory", "count"))
    directory = c.abs_path("bootSlots.directory", d["directory"]) if "directory" in d else ""
    if directory == "/":
        c.bad("bootSlots.directory", '"/" is not allowed: the slot files need a directory of their own')
    count = c.integer("bootSlots.count", d["count"], BOOT_SLOTS) if "count" in d else 1
    return BootSlots(directory, count)


def _parse_serial_console(c: _Checker, raw: Any) -> SerialConsole | None:
    if raw is None:
        return None
    d = c.obj("serialConsole", raw, ("socketPath", "uid", "gid"), ("socketPath",))
    path = c.abs_path("serialConsole.socketPath", d["socketPath"]) if "socketPath" in d else ""
    if path and len(path.encode()) > SOCKET_PATH_MAX:
        c.bad("serialConsole.socketPath", f"is {len(path.encode())} bytes long, above the maximum {SOCKET_PATH_MAX} "
                                          "(unix socket paths are limited to 107 bytes)")
    elif path and not CONSOLE_PATH_RE.match(path):
        c.bad("serialConsole.socketPath", f"{_show(path)} has characters other than letters, digits and _ . / -")
    uid = c.integer("serialConsole.uid", d["uid"], CONSOLE_ID) if "uid" in d else 0
    gid = c.integer("serialConsole.gid", d["gid"], CONSOLE_ID) if "gid" in d else 0
    return SerialConsole(path, uid, gid)


TOP_FIELDS = ("apiVersion", "kind", "vm", "machine", "boot", "rootDisk", "identity", "network", "hypervisor",
              "readiness", "bootSlots", "stopTimeoutSeconds", "stopRetryIntervalSeconds", "runtimeDir", "serialLogPath",
              "serialConsole", "result", "readyMarkerPath")
TOP_REQUIRED = ("apiVersion", "kind", "vm", "machine", "boot", "rootDisk", "network", "hypervisor", "runtimeDir",
                "serialLogPath", "result")


def parse(doc: Any) -> LauncherConfig:
    """Validate a decoded JSON document and return the config.

    Args:
        doc: the decoded JSON (any type; a non-object is a problem).
    Returns:
        LauncherConfig with defaults filled in (docs/launcher-protocol.md lists them).
    Raises:
        ConfigError: with every problem found, in document order.
    """
    c = _Checker()
    d = c.obj("", doc, TOP_FIELDS, TOP_REQUIRED)
    if not isinstance(doc, dict):
        raise ConfigError(["(document): expected a JSON object, got " + _type_name(doc)])
    if "apiVersion" in d and d["apiVersion"] != API_VERSION:
        c.bad("apiVersion", f"{_show(d['apiVersion'])} is not supported (this launcher speaks {API_VERSION})")
    if "kind" in d and d["kind"] != KIND:
        c.bad("kind", f"{_show(d['kind'])} is not {KIND}")
    vm = _parse_vm(c, d.get("vm", {})) if "vm" in d else VMRef("", "", "", 0)
    machine = _parse_machine(c, d["machine"]) if "machine" in d else Machine(1, 128)
    boot = _parse_boot(c, d["boot"]) if "boot" in d else Boot("", None, "")
    root = _parse_root_disk(c, d["rootDisk"]) if "rootDisk" in d else RootDisk(None, None, "Writeback")
    identity = _parse_identity(c, d.get("identity", {}), vm)
    net = _parse_network(c, d["network"]) if "network" in d else Network("none")
    hyp = _parse_hypervisor(c, d["hypervisor"]) if "hypervisor" in d else Hypervisor("qemu")
    readiness = _parse_readiness(c, d.get("readiness"), net)
    if readiness is None and net.mode != "none" and "network" in d:
        c.bad("readiness", f"is required when network.mode is {net.mode}")
    if net.mode == "user":
        _ask(c, hyp.type, "userNetwork", _show(net.mode))
    if root.rbd is not None:
        _ask(c, hyp.type, "rbd")
    if root.cache == "None":
        _ask(c, hyp.type, "directIO", _show(root.cache))
    if root.format == "qcow2":
        _ask(c, hyp.type, "qcow2", _show(root.format))
    boot_slots = _parse_boot_slots(c, d.get("bootSlots"))
    stop = c.integer("stopTimeoutSeconds", d.get("stopTimeoutSeconds", 30), STOP_TIMEOUT_SECONDS)
    stop_retry = c.integer("stopRetryIntervalSeconds",
                           d.get("stopRetryIntervalSeconds", STOP_RETRY_INTERVAL_DEFAULT), STOP_RETRY_INTERVAL_SECONDS)
    runtime_dir = c.abs_path("runtimeDir", d["runtimeDir"]) if "runtimeDir" in d else ""
    if len(runtime_dir) > RUNTIME_DIR_MAX:
        c.bad("runtimeDir", f"is {len(runtime_dir)} characters long, above the maximum {RUNTIME_DIR_MAX} "
                            "(unix socket paths are limited to 107 bytes)")
    serial = c.abs_path("serialLogPath", d["serialLogPath"]) if "serialLogPath" in d else ""
    console = _parse_serial_console(c, d.get("serialConsole"))
    if console is not None:
        _ask(c, hyp.type, "serialConsole")
    res = c.obj("result", d.get("result", {}), ("path", "terminationMessagePath"), ("path",)) \
        if "result" in d else {}
    result_path = c.abs_path("result.path", res["path"]) if "path" in res else ""
    term = c.optional("result.terminationMessagePath", res.get("terminationMessagePath"), c.abs_path)
    ready = d.get("readyMarkerPath")
    ready_path = c.abs_path("readyMarkerPath", ready) if ready is not None else \
        (runtime_dir.rstrip("/") + "/ready" if runtime_dir else "")
    if c.problems:
        raise ConfigError(c.problems)
    return LauncherConfig(vm, machine, boot, root, identity, net, hyp, readiness, stop, runtime_dir, serial,
                          result_path, term, ready_path, boot_slots, stop_retry, console, raw=doc)
