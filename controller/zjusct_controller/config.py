"""The controller's configuration (its JSON file, docs/controller.md): the launcher defaults every launcher Pod gets
(:class:`Config`) and the Ceph cluster of RBD root disks (:class:`CephConfig`), each parsed and checked by its
``from_dict``. Pure: no I/O (``__main__`` reads the file).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.placement import DEFAULT_RATIOS
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import validate_disk_io

GRACE_MARGIN_S = 30  # seconds a launcher Pod's grace period adds to stopTimeoutSeconds (the stop, then the result)
BOOT_SLOTS_MAX = 1024  # the launcher's bootSlots.count range
CEPH_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # the launcher's rootDisk.rbd pool/image/user rule
_MONITOR_RE = re.compile(r"^[][A-Za-z0-9_.:/,-]{1,256}$")  # host:port, [v2:ip:port/0,v1:ip:port/0], names
_SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # DNS subdomain


@dataclass(frozen=True)
class CephConfig:
    """The Ceph cluster of RBD root disks (``ceph`` in the controller's JSON config, docs/controller.md).

    Attributes:
        monitors: ``mon_host`` entries (``10.0.0.1:6789`` or ``[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]``), joined
            with ``,`` into the ``ceph.conf`` the launcher Pod gets.
        user: the cephx user QEMU's librbd connects as, without ``client.`` (rule of the launcher's
            ``rootDisk.rbd.user``).
        secret_name: a Secret in each VM's namespace whose key ``keyring`` holds a Ceph keyring file with
            ``[client.<user>]`` and its ``key``; mounted read-only into the launcher Pod, never read by the
            controller.
        fence_user, fence_keyring: the controller's own cephx identity for fencing (``fenceUser`` without
            ``client.``, ``fenceKeyring`` a keyring file path on the controller's filesystem; caps ``mon 'profile
            rbd'``, which allows ``osd blocklist add``, and ``osd 'profile rbd pool=...'`` to read the image's
            watchers). None: no fencing, a VM whose old launcher is on a lost node stays blocked.
    """

    monitors: tuple
    user: str
    secret_name: str
    fence_user: Optional[str] = None
    fence_keyring: Optional[str] = None

    @classmethod
    def from_dict(cls, raw: Any) -> CephConfig:
        """Build from ``{"monitors": [...], "user": ..., "secretName": ..., ["fenceUser": ..., "fenceKeyring":
        ...]}``.

        Raises:
            ValueError: not an object, unknown or missing keys, only one of ``fenceUser``/``fenceKeyring``, or a
                value outside its rule (named).
        """
        keys = ("monitors", "user", "secretName")
        optional = ("fenceUser", "fenceKeyring")
        if not isinstance(raw, dict):
            raise ValueError(f"controller config: ceph: must be an object with keys {', '.join(keys)}")
        unknown = sorted(set(raw) - set(keys) - set(optional))
        if unknown:
            raise ValueError(f"controller config: ceph: unknown keys {', '.join(unknown)} "
                             f"(allowed: {', '.join(keys + optional)})")
        missing = [k for k in keys if not raw.get(k)]
        if missing:
            raise ValueError(f"controller config: ceph: required keys missing: {', '.join(missing)}")
        mons = raw["monitors"]
        if not isinstance(mons, list) or not all(isinstance(m, str) and _MONITOR_RE.match(m) for m in mons):
            raise ValueError(f"controller config: ceph.monitors: {mons!r} is not a list of monitor addresses "
                             "(host:port or [v2:ip:port/0,v1:ip:port/0]; no spaces)")
        user = raw["user"]
        if not isinstance(user, str) or not CEPH_NAME_RE.match(user) or user.startswith("client."):
            raise ValueError(f"controller config: ceph.user: {user!r} is not a cephx user name without 'client.' "
                             "(1-128 of A-Z a-z 0-9 _ . -)")
        secret = raw["secretName"]
        if not isinstance(secret, str) or not _SECRET_NAME_RE.match(secret):
            raise ValueError(f"controller config: ceph.secretName: {secret!r} is not a Secret name (DNS subdomain)")
        fence_user, fence_keyring = raw.get("fenceUser"), raw.get("fenceKeyring")
        if (fence_user is None) != (fence_keyring is None):
            raise ValueError("controller config: ceph.fenceUser and ceph.fenceKeyring go together "
                             f"(got {'fenceUser' if fence_user is not None else 'fenceKeyring'} alone)")
        if fence_user is not None and (not isinstance(fence_user, str) or not CEPH_NAME_RE.match(fence_user)
                                       or fence_user.startswith("client.")):
            raise ValueError(f"controller config: ceph.fenceUser: {fence_user!r} is not a cephx user name without "
                             "'client.' (1-128 of A-Z a-z 0-9 _ . -)")
        if fence_keyring is not None and (not isinstance(fence_keyring, str) or not fence_keyring.startswith("/")):
            raise ValueError(f"controller config: ceph.fenceKeyring: {fence_keyring!r} is not an absolute path "
                             "(a keyring file on the controller's filesystem)")
        return cls(monitors=tuple(mons), user=user, secret_name=secret, fence_user=fence_user,
                   fence_keyring=fence_keyring)

    def conf_text(self) -> str:
        """The ``ceph.conf`` of the launcher Pod: the monitors and cephx, nothing secret."""
        return f"[global]\nmon_host = {','.join(self.monitors)}\nauth_client_required = cephx\n"


@dataclass(frozen=True)
class Config:
    """What the controller puts into every launcher Pod (the launcher defaults; JSON file, docs/controller.md).

    Attributes:
        launcher_image: container image of the launcher (roles/launcher_image), pulled ``IfNotPresent``.
        image_dir: directory on the node holding the guest image set (``vmlinuz``, ``initrd.img``), mounted
            read-only at ``/images`` (hostPath).
        cmdline: guest kernel command line (the image set's default cmdline).
        accel: ``tcg``, ``kvm`` or ``auto`` (launcher ``hypervisor.accel``).
        tcg_cache_mib: TCG translation cache (``hypervisor.tcgTranslationCacheMiB``); counted in the Pod's memory
            request when ``accel`` is ``tcg``.
        tcg_cpu_model: QEMU ``-cpu`` under TCG (``hypervisor.tcgCPUModel``; x86-64-v2 guests need e.g.
            ``Nehalem,+rdrand``); checked by the launcher, whose ConfigInvalid result names it.
        readiness_timeout_s: launcher ``readiness.timeoutSeconds`` (boot -> SSH banner).
        stop_timeout_s: launcher ``stopTimeoutSeconds``; the Pod's grace period is this plus
            :data:`GRACE_MARGIN_S` so the launcher can stop the guest and write its result.
        cpu_ratio, memory_ratio: overcommit ratios (default :data:`model.placement.DEFAULT_RATIOS`).
        overhead_cpu_m, overhead_memory_mib: per-VM overhead added to the requests (launcher, QEMU, TAP).
        node_selector: merged under the CloudVM's ``spec.nodeSelector`` (the VM's own entries win).
        tolerations: copied into every launcher Pod.
        ceph: the Ceph cluster of RBD root disks (:class:`CephConfig`); None: Block claims are refused.
        max_concurrent_boots: at most this many guests boot at once on a node (0..1024, 0 = no limit): the
            launcher's ``bootSlots`` on the node directory ``boot_slot_dir`` (hostPath, created if missing)
            mounted at :data:`.pod.BOOT_SLOTS_MOUNT` (docs/launcher-protocol.md).
        boot_slot_dir: the boot slots' directory on every node; host-backend launchers of the same node share it.
        disk_io_limits: the operator's disk I/O limits of every VM's root disk (``diskIOLimits``,
            :data:`model.spec.DISK_IO` keys): the default and the most a VM gets; a VM's ``spec.diskIO`` can only lower
            them ({} = none).
    """

    launcher_image: str
    image_dir: str
    cmdline: str
    accel: str = "tcg"
    tcg_cache_mib: int = 128
    tcg_cpu_model: str = "qemu64,+rdrand"
    readiness_timeout_s: int = 1500
    stop_timeout_s: int = 120
    cpu_ratio: float = DEFAULT_RATIOS["cpu"]
    memory_ratio: float = DEFAULT_RATIOS["memory"]
    overhead_cpu_m: int = 100
    overhead_memory_mib: int = 64
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    ceph: Optional[CephConfig] = None
    max_concurrent_boots: int = 0
    boot_slot_dir: str = "/run/lock/zjusct-cloud/boot-slots"
    disk_io_limits: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict) -> Config:
        """Build from the JSON config (camelCase keys as documented in docs/controller.md).

        Raises:
            ValueError: unknown keys or missing required keys (named).
        """
        keys = {"launcherImage": "launcher_image", "imageDir": "image_dir", "cmdline": "cmdline",
                "accel": "accel", "tcgTranslationCacheMiB": "tcg_cache_mib", "tcgCPUModel": "tcg_cpu_model",
                "readinessTimeoutSeconds": "readiness_timeout_s", "stopTimeoutSeconds": "stop_timeout_s",
                "cpuOvercommit": "cpu_ratio", "memoryOvercommit": "memory_ratio",
                "overheadCPUMillis": "overhead_cpu_m", "overheadMemoryMiB": "overhead_memory_mib",
                "nodeSelector": "node_selector", "tolerations": "tolerations", "ceph": "ceph",
                "maxConcurrentBoots": "max_concurrent_boots", "bootSlotDir": "boot_slot_dir",
                "diskIOLimits": "disk_io_limits"}
        unknown = sorted(set(raw) - set(keys))
        if unknown:
            raise ValueError(f"controller config: unknown keys {', '.join(unknown)} (allowed: {', '.join(keys)})")
        missing = [k for k in ("launcherImage", "imageDir", "cmdline") if not raw.get(k)]
        if missing:
            raise ValueError(f"controller config: required keys missing: {', '.join(missing)}")
        if raw.get("accel", "tcg") not in ("tcg", "kvm", "auto"):
            raise ValueError(f"controller config: accel: {raw['accel']!r} is not one of tcg, kvm, auto")
        boots = raw.get("maxConcurrentBoots", cls.max_concurrent_boots)
        if isinstance(boots, bool) or not isinstance(boots, int) or not 0 <= boots <= BOOT_SLOTS_MAX:
            raise ValueError(f"controller config: maxConcurrentBoots: {boots!r} is not 0 (no limit) or an integer"
                             f" 1-{BOOT_SLOTS_MAX}")
        slot_dir = raw.get("bootSlotDir", cls.boot_slot_dir)
        if not isinstance(slot_dir, str) or not slot_dir.startswith("/") or slot_dir == "/" \
                or posixpath.normpath(slot_dir) != slot_dir:
            raise ValueError(f"controller config: bootSlotDir: {slot_dir!r} is not a normalised absolute path"
                             " other than / (a node directory mounted into every launcher Pod)")
        io_problems = validate_disk_io(raw.get("diskIOLimits", {}), "diskIOLimits")
        if io_problems:
            raise ValueError(f"controller config: {'; '.join(io_problems)}")
        args = {keys[k]: v for k, v in raw.items()}
        if "ceph" in raw:
            args["ceph"] = CephConfig.from_dict(raw["ceph"])
        return cls(**args)

    @property
    def grace_period_s(self) -> int:
        """Seconds a launcher Pod is given to end once deleted: :attr:`stop_timeout_s` + :data:`GRACE_MARGIN_S`
        (its ``terminationGracePeriodSeconds`` and the grace of the controller's deletes)."""
        return int(self.stop_timeout_s) + GRACE_MARGIN_S
