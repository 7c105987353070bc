"""The controller's pure decisions: from a CloudVM, its launcher Pods, their Nodes and its root volume claim,
the actions to take and the status to write. No I/O; the kopf adapter (:mod:`.reconcile`) reads the objects,
calls :func:`decide` and carries the :class:`Plan` out.

Objects are plain dicts in the API's camelCase shape (``ApiClient.sanitize_for_serialization`` of the typed
models, or what ``CustomObjectsApi`` returns). Times are RFC 3339 strings (UTC, ``Z``); sizes MiB; CPU millicores.

The status comes from :func:`model.phase.derive_status` (the same state machine as the host backend): a VM is Running
only while the launcher Pod of ``spec.bootID`` runs *and* its readiness probe (the launcher's ready marker,
written after the guest's SSH banner answered, docs/launcher-protocol.md §2 step 8) has passed.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import Placement
from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import (
    launcher_config as build_launcher_config,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    OUT_OF_SERVICE_TAINT,
    node_ready,
    out_of_service,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.names import DNS1123_LABEL_MAX, TAP_PREFIX, fit
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation, Status, derive_status
from ansible_collections.zjusct.cloud.plugins.module_utils.model.placement import DEFAULT_RATIOS
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import ADMITTED_FIELD, admitted_boot
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    API_VERSION,
    CLAIMED_BY_MARK,
    FENCE_FINALIZER,
    GROUP,
    KIND,
    OWNER_MARK,
    PLURAL,
    VERSION,
    validate_disk_io,
    with_defaults,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network.hostnet import isolation_script

FINALIZER = "cloud.zjusct.io/launcher"
LABEL_VM = "cloud.zjusct.io/vm"
LABEL_BOOT = "cloud.zjusct.io/boot-id"
# spec.antiAffinityGroup on the launcher Pod: with the owner label, what its required pod anti-affinity selects
LABEL_ANTI_AFFINITY_GROUP = "cloud.zjusct.io/anti-affinity-group"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "zjusct-controller"
CONFIG_ANNOTATION = "cloud.zjusct.io/launcher-config"
CLAIMED_BY = CLAIMED_BY_MARK  # PVC annotation: uid of the CloudVM using the root volume
# PV and PVC label: the owner id of a root volume (root_volume_claim writes it); on a launcher Pod the CloudVM's
# spec.owner (a DNS label, so a valid label value), whom the launcher Pod policy of config/policy/owner-admission.yaml
# lets delete the Pod
OWNER_LABEL = OWNER_MARK
ROOT_CLAIM = "cloud.zjusct.io/root-claim"  # launcher Pod annotation: the root volume claim it writes
CEPH_CONF_ANNOTATION = "cloud.zjusct.io/ceph-conf"  # launcher Pod annotation: ceph.conf (monitors only, no key)
RBD_DRIVER = "rbd.csi.ceph.com"  # the CSI driver name an RBD PV carries (Ceph-CSI's, no driver needed on nodes)
CEPH_CONF_PATH = "/etc/zjusct/ceph.conf"
KEYRING_DIR = "/etc/zjusct-ceph"
KEYRING_PATH = f"{KEYRING_DIR}/keyring"
KEYRING_SECRET_KEY = "keyring"  # noqa: S105 - the key of the Secret holding the Ceph keyring file
CONTAINER = "launcher"
# OUT_OF_SERVICE_TAINT (model.lifecycle, KEP-2268 non-graceful node shutdown): the operator's statement that a
# NotReady node is off (docs/controller.md Fencing). The launcher Pod tolerates it and the NoExecute taints of a lost
# node, so that Kubernetes neither evicts nor garbage-collects it: the Pod stays the record of the old RBD client
# until the controller fenced it.
# The finalizer of a launcher Pod with an RBD root disk. Kubernetes removes a Pod from a lost node by itself, whatever
# it tolerates, once the Pod is terminating (a stop, a drain, a newer boot asked for it before the node was lost): the
# pod GC marks it Failed and force-deletes it when the node is out of service (gcTerminating) or its Node object is
# gone (gcOrphaned), while its launcher may still write the image (a partitioned node). The finalizer keeps the Pod,
# the record of the RBD client to fence, until the controller knows its launcher ended (:func:`releasable`) or has
# fenced it (Plan.fence) - as the Job controller keeps its Pods with batch.kubernetes.io/job-tracking.
POD_FINALIZER = FENCE_FINALIZER
LAUNCHER_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": OUT_OF_SERVICE_TAINT, "operator": "Exists", "effect": "NoExecute"},
)
SSH_PORT = 22
# A launcher Pod deleted so that its VM runs elsewhere: the API server's DisruptionTarget condition reasons
# (k8s.io/api core/v1 PodReasonEvictionByEvictionAPI - kubectl drain, kubernetes.core.k8s_drain, any Eviction -
# and PodReasonDeletionByTaintManager - a NoExecute taint the launcher does not tolerate). The VM keeps its bootID:
# once the old Pod is gone the controller creates the boot's Pod again, and the scheduler places it on another node
# (docs/controller.md, Drain).
MOVE_REASONS = ("EvictionByEvictionAPI", "DeletionByTaintManager")
EVICTED = "Evicted"
STOP_OUTCOMES = ("StopRequested", "StopTimeoutKilled")  # LauncherResult reasons of a stop (graceful or by force)
# The extended resource a node advertises for guaranteed bandwidth (roles/cluster, module k8s_node_resources):
# integer units of Mbit/s on the wire, the unit of spec.network.bandwidth and model.placement's bandwidth dimension.
BANDWIDTH_RESOURCE = "cloud.zjusct.io/bandwidth-mbps"

# The launcher's network inside the Pod's netns (as tests/integration/k8s_node/launcher_pod.py): bridge br0
# 10.0.3.1/30, the guest's TAP zjt0 (created by the launcher) on it with the guest at 10.0.3.2, DNAT of TCP 22
# arriving on eth0 to the guest, so <Pod IP>:22 is the guest's sshd; the guest's own traffic leaves masqueraded as
# the Pod IP. The host backend's L2 isolation table guards the TAP (one rule set, network.hostnet): frames from the
# guest carry its MAC, and only its IPv4 address or ARP for it - a guest cannot send as another Pod's address and
# so pass that Pod's namespace's NetworkPolicy (docs/security.md, Tenants' networks on Kubernetes).
GUEST_IP = "10.0.3.2"
GUEST_MAC = "52:54:00:0a:00:02"
POD_SIDE_IP = "10.0.3.1"
POD_TAP = f"{TAP_PREFIX}0"
RUNTIME_DIR = "/run/zjusct/vm"
READY_MARKER = f"{RUNTIME_DIR}/ready"
NET_SETUP = f"""set -e
ip link add br0 type bridge
ip addr add {POD_SIDE_IP}/30 dev br0
ip link set br0 up
nft -f - <<'NFT'
table ip zjusct_pod {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "eth0" tcp dport {SSH_PORT} dnat to {GUEST_IP}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "eth0" ip saddr {GUEST_IP} masquerade
  }}
}}
{isolation_script({"vm": [{"tap": POD_TAP, "mac": GUEST_MAC, "ipv4": GUEST_IP}]})}NFT
exec python3 -m zjusct_launcher run --config /etc/zjusct/launcher.json
"""


_CEPH_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # the launcher's rootDisk.rbd pool/image/user rule
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
        if not isinstance(user, str) or not _CEPH_NAME_RE.match(user) or user.startswith("client."):
            raise ValueError(f"controller config: ceph.user: {user!r} is not a cephx user name without 'client.' "
                             "(1-128 of A-Z a-z 0-9 _ . -)")
        secret = raw["secretName"]
        if not isinstance(secret, str) or not _SECRET_NAME_RE.match(secret):
            raise ValueError(f"controller config: ceph.secretName: {secret!r} is not a Secret name (DNS subdomain)")
        fence_user, fence_keyring = raw.get("fenceUser"), raw.get("fenceKeyring")
        if (fence_user is None) != (fence_keyring is None):
            raise ValueError("controller config: ceph.fenceUser and ceph.fenceKeyring go together "
                             f"(got {'fenceUser' if fence_user is not None else 'fenceKeyring'} alone)")
        if fence_user is not None and (not isinstance(fence_user, str) or not _CEPH_NAME_RE.match(fence_user)
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
            mounted at :data:`BOOT_SLOTS_MOUNT` (docs/launcher-protocol.md).
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


GRACE_MARGIN_S = 30
BOOT_SLOTS_MAX = 1024  # the launcher's bootSlots.count range
BOOT_SLOTS_MOUNT = "/run/zjusct-boot-slots"  # where a launcher Pod sees the node's boot slot directory


# --------------------------------------------------------------------------- the root volume


class VolumeProblem(Exception):
    """A root volume claim the controller cannot start a VM on.

    Attributes:
        reason: the status reason (``VolumeClaimNotReady`` or ``VolumeNotSupported``).
        message: names the object (claim or PersistentVolume), the field, its value and what is allowed.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def is_block_claim(claim: Optional[dict]) -> bool:
    """True when the claim asks for a raw block volume (``spec.volumeMode: Block``): an RBD root disk."""
    return ((claim or {}).get("spec") or {}).get("volumeMode") == "Block"


def needs_volume(vm: dict, claim: Optional[dict]) -> bool:
    """True when the adapter must read the claim's PersistentVolume before deciding: the claim is Bound and a
    launcher Pod of ``spec.bootID`` may be created (``powerState`` Running, the VM not being deleted, no Pod of
    this boot recorded in the status, or the boot's Pod was evicted and is created again once gone): its owner mark
    is checked (:func:`owner_problem`) and, for a Block claim, it names the RBD image (:func:`rbd_root_disk`).
    Otherwise the PV is not needed (no extra API call)."""
    if ((claim or {}).get("status") or {}).get("phase") != "Bound":
        return False
    spec, prev = with_defaults(vm.get("spec") or {}), vm.get("status") or {}
    if spec["powerState"] != "Running" or (vm.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not (prev.get("bootID") == int(spec["bootID"]) and prev.get("pod")) or being_moved(prev)


def being_moved(status: dict) -> bool:
    """True when ``status`` says the current boot's launcher Pod was evicted (``Stopping/Evicted``): once that Pod is
    gone, the boot's Pod is created again (:func:`decide`, docs/controller.md Drain)."""
    return (status.get("phase"), status.get("reason")) == ("Stopping", EVICTED)


def rbd_root_disk(claim: dict, volume: Optional[dict], cfg: Config) -> dict:
    """The launcher's ``rootDisk.rbd`` for a Bound Block claim, from its PersistentVolume.

    The PV must be bound to this claim (``spec.claimRef``), ``volumeMode: Block`` and name the image the way
    Ceph-CSI does: ``spec.csi.driver`` :data:`RBD_DRIVER`, ``spec.csi.volumeAttributes.pool`` and ``.imageName``
    (1-128 of ``A-Z a-z 0-9 _ . -``, the launcher's rule). No CSI driver runs: the launcher Pod does not mount
    the claim, QEMU opens the image through librbd with :attr:`Config.ceph`.

    Returns:
        ``{"pool", "image", "conf", "user", "keyringPath"}`` (paths inside the launcher Pod).

    Raises:
        VolumeProblem: ``VolumeNotSupported`` (no ``ceph`` in the controller config, the PV is not an RBD PV or
            not Block) or ``VolumeClaimNotReady`` (the PV is missing or bound to another claim), naming the
            object and the field.
    """
    md, spec = claim.get("metadata") or {}, claim.get("spec") or {}
    name, pv_name = md.get("name", ""), spec.get("volumeName") or ""
    if cfg.ceph is None:
        raise VolumeProblem("VolumeNotSupported", f"the root volume claim {name} is a Block volume (spec.volumeMode)"
                            " but the controller config has no ceph section (docs/controller.md)")
    if volume is None:
        raise VolumeProblem("VolumeClaimNotReady", f"PersistentVolume {pv_name or '(none)'} of the root volume "
                            f"claim {name} (spec.volumeName) does not exist")
    vspec = volume.get("spec") or {}
    ref = vspec.get("claimRef") or {}
    if (ref.get("namespace"), ref.get("name")) != (md.get("namespace"), name) or (
            ref.get("uid") and md.get("uid") and ref["uid"] != md["uid"]):
        raise VolumeProblem("VolumeClaimNotReady", f"PersistentVolume {pv_name}: spec.claimRef is "
                            f"{ref.get('namespace')}/{ref.get('name')}, not the root volume claim "
                            f"{md.get('namespace')}/{name}")
    if vspec.get("volumeMode") != "Block":
        raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.volumeMode is "
                            f"{vspec.get('volumeMode') or 'Filesystem'}, an RBD root disk needs Block")
    csi = vspec.get("csi") or {}
    if csi.get("driver") != RBD_DRIVER:
        raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.csi.driver is "
                            f"{csi.get('driver') or '(none)'}, an RBD root disk needs {RBD_DRIVER}")
    attrs = csi.get("volumeAttributes") or {}
    for key in ("pool", "imageName"):
        value = attrs.get(key)
        if not isinstance(value, str) or not _CEPH_NAME_RE.match(value):
            raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.csi.volumeAttributes."
                                f"{key} is {value!r}, not an RBD name (1-128 of A-Z a-z 0-9 _ . -)")
    return {"pool": attrs["pool"], "image": attrs["imageName"], "conf": CEPH_CONF_PATH, "user": cfg.ceph.user,
            "keyringPath": KEYRING_PATH}


# --------------------------------------------------------------------------- names and the Pod


def pod_name(vm_name: str, boot_id: int) -> str:
    """The launcher Pod of one boot: ``<vm>-boot-<bootID>`` within 63 characters (a DNS label).

    The suffix ``-boot-<bootID>`` is always kept whole; a VM name too long for it is fitted by
    :func:`model.names.fit` (cut prefix + hash) to the room left. The launcher Pod policy
    (config/policy/owner-admission.yaml) recognises a launcher Pod by that suffix where it sees only the Pod's name
    (exec, attach, port-forward, proxy, eviction). A name shorter than 63 characters is ``<vm>-boot-<bootID>``
    itself, as ``fit(f"{vm}-boot-{id}", 63)`` gave it before; a longer one was hashed whole, and keeps the suffix
    now (exactly 63 characters either way).

    Deterministic, so a retried or restarted reconcile gets AlreadyExists instead of a second Pod.
    """
    suffix = f"-boot-{int(boot_id)}"
    return fit(vm_name, DNS1123_LABEL_MAX - len(suffix)) + suffix


def guaranteed_mbps(spec: dict) -> int:
    """``spec.network.bandwidth.guaranteedMbps`` (Mbit/s), 0 when the VM has no bandwidth or no guarantee."""
    band = (spec.get("network") or {}).get("bandwidth") or {}
    return int(band.get("guaranteedMbps") or 0)


def pod_resources(spec: dict, cfg: Config) -> dict:
    """Resources of a launcher Pod from the guest's size and its guaranteed bandwidth.

    ``cpu = ceil(vcpus * 1000 / cpu_ratio) + overhead_cpu_m`` millicores;
    ``memory = ceil(memoryMiB / memory_ratio) + overhead_memory_mib (+ tcg_cache_mib under TCG)`` MiB;
    no CPU or memory limits (the guest may burst on idle CPU).
    Example (defaults, 1 vCPU, 512 MiB, TCG): 350m and 534Mi.

    A guaranteed bandwidth (``spec.network.bandwidth.guaranteedMbps`` > 0) adds the extended resource
    :data:`BANDWIDTH_RESOURCE` = the guarantee in Mbit/s to the requests *and* the limits (Kubernetes requires
    them equal for an extended resource). No ratio divides it: the node advertises ``floor(NIC Mbit/s x bandwidth
    ratio)`` (roles/cluster), so the scheduler's ``sum(requests) <= advertised`` is ``model.placement``'s and
    ``model.qos``'s
    node admission ``sum(guaranteed) <= floor(NIC x ratio)``. Without a guarantee nothing is requested.
    """
    spec = with_defaults(spec)
    cpu_m = math.ceil(int(spec["vcpus"]) * 1000 / float(cfg.cpu_ratio)) + int(cfg.overhead_cpu_m)
    mem = math.ceil(int(spec["memoryMiB"]) / float(cfg.memory_ratio)) + int(cfg.overhead_memory_mib)
    if cfg.accel == "tcg":
        mem += int(cfg.tcg_cache_mib)
    out: dict[str, Any] = {"requests": {"cpu": f"{cpu_m}m", "memory": f"{mem}Mi"}}
    mbps = guaranteed_mbps(spec)
    if mbps > 0:
        out["requests"][BANDWIDTH_RESOURCE] = str(mbps)
        out["limits"] = {BANDWIDTH_RESOURCE: str(mbps)}
    return out


def launcher_config(vm: dict, cfg: Config, rbd: Optional[dict] = None) -> dict:
    """LauncherConfig v1 (docs/launcher-protocol.md) of the VM's current boot, paths as the Pod sees them.

    Root disk ``/vm/root.raw`` on the root volume claim (mounted at ``/vm``), or ``rbd`` (from
    :func:`rbd_root_disk`) opened by QEMU's librbd (``/vm`` is then a Pod-local emptyDir); serial log and
    per-boot result file in ``/vm``; the TAP is created by the launcher on the Pod's bridge.
    """
    boot = int(with_defaults(vm.get("spec") or {})["bootID"])
    return build_launcher_config(vm, Placement(
        boot={"kernel": "/images/vmlinuz", "initrd": "/images/initrd.img", "cmdline": cfg.cmdline},
        root_disk={"rbd": dict(rbd), "cache": "Writeback"} if rbd else {"path": "/vm/root.raw", "cache": "Writeback"},
        network={"mode": "tap", "tap": POD_TAP, "createTap": True, "bridge": "br0", "mac": GUEST_MAC,
                 "ipv4": f"{GUEST_IP}/30", "gateway": POD_SIDE_IP, "dns": []},
        hypervisor={"type": "qemu", "accel": cfg.accel, "tcgTranslationCacheMiB": int(cfg.tcg_cache_mib),
                    "tcgCPUModel": str(cfg.tcg_cpu_model)},
        readiness={"timeoutSeconds": int(cfg.readiness_timeout_s)},
        stop_timeout_seconds=int(cfg.stop_timeout_s),
        runtime_dir=RUNTIME_DIR,
        serial_log_path="/vm/serial.log",
        result={"path": f"/vm/result-{boot}.json", "terminationMessagePath": "/dev/termination-log"},
        boot_slots={"directory": BOOT_SLOTS_MOUNT, "count": int(cfg.max_concurrent_boots)}
        if cfg.max_concurrent_boots else None,
        disk_io_limits=cfg.disk_io_limits,
    ))


def owner_reference(vm: dict) -> dict:
    """The ownerReference that makes a launcher Pod the CloudVM's dependent (garbage-collected with it)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": vm["metadata"]["name"], "uid": vm["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def launcher_pod(vm: dict, cfg: Config, rbd: Optional[dict] = None) -> dict:
    """The launcher Pod of the VM's current boot (``spec.bootID``).

    The annotation :data:`ROOT_CLAIM` names the root volume claim (the writer check reads it). With ``rbd``
    (:func:`rbd_root_disk`) the claim is not mounted: ``ceph.conf`` (monitors only) is the annotation
    :data:`CEPH_CONF_ANNOTATION` projected to :data:`CEPH_CONF_PATH`, the keyring is the ``keyring`` key of the
    Secret ``ceph.secretName`` mounted read-only (0400) at :data:`KEYRING_DIR`; no key is in the manifest; and the
    Pod carries the finalizer :data:`POD_FINALIZER` (the record of its RBD client until it ended or was fenced).

    restartPolicy Never (a Pod is one boot); the LauncherConfig is an annotation projected into
    ``/etc/zjusct/launcher.json`` by a downwardAPI volume (one object, created atomically); the LauncherResult is
    the container's termination message; readiness = the launcher's ready marker exists; grace period
    ``stop_timeout_s + 30``; ``NET_ADMIN`` and ``/dev/net/tun`` for the bridge, TAP and DNAT in the Pod's own
    netns, ``net.ipv4.ip_forward=1`` for that netns only (an unsafe sysctl the node must allow).
    """
    md, spec = vm["metadata"], with_defaults(vm.get("spec") or {})
    boot = int(spec["bootID"])
    name = pod_name(md["name"], boot)
    node_selector = {**cfg.node_selector, **(spec.get("nodeSelector") or {})}
    vm_volume: dict[str, Any] = {"name": "vm", "persistentVolumeClaim": {"claimName": spec["rootVolumeClaim"]}}
    config_items = [{"path": "launcher.json",
                     "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_ANNOTATION}']"}}]
    annotations = {CONFIG_ANNOTATION: json.dumps(launcher_config(vm, cfg, rbd), sort_keys=True),
                   ROOT_CLAIM: spec["rootVolumeClaim"]}
    extra_mounts: list[dict] = []
    extra_volumes: list[dict] = []
    if cfg.max_concurrent_boots:
        extra_mounts.append({"name": "boot-slots", "mountPath": BOOT_SLOTS_MOUNT})
        extra_volumes.append({"name": "boot-slots",
                              "hostPath": {"path": cfg.boot_slot_dir, "type": "DirectoryOrCreate"}})
    if rbd:
        if cfg.ceph is None:
            raise ValueError("launcher_pod: an RBD root disk needs the controller config's ceph section")
        vm_volume = {"name": "vm", "emptyDir": {}}
        config_items.append({"path": "ceph.conf",
                             "fieldRef": {"fieldPath": f"metadata.annotations['{CEPH_CONF_ANNOTATION}']"}})
        annotations[CEPH_CONF_ANNOTATION] = cfg.ceph.conf_text()
        extra_mounts.append({"name": "ceph-keyring", "mountPath": KEYRING_DIR, "readOnly": True})
        extra_volumes.append({"name": "ceph-keyring", "secret": {
            "secretName": cfg.ceph.secret_name, "defaultMode": 0o400,
            "items": [{"key": KEYRING_SECRET_KEY, "path": KEYRING_PATH.rsplit("/", 1)[1]}]}})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(cfg.stop_timeout_s) + GRACE_MARGIN_S,
        "enableServiceLinks": False,
        "dnsPolicy": "Default",  # the launcher needs no cluster DNS (the guest gets none either)
        "automountServiceAccountToken": False,
        "hostname": fit(md["name"], DNS1123_LABEL_MAX),
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_forward", "value": "1"}]},
        "containers": [{
            "name": CONTAINER,
            "image": cfg.launcher_image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", NET_SETUP],
            "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                                "capabilities": {"add": ["NET_ADMIN"]}},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "resources": pod_resources(spec, cfg),
            "readinessProbe": {"exec": {"command": ["cat", READY_MARKER]},
                               "periodSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1},
            "volumeMounts": [
                {"name": "images", "mountPath": "/images", "readOnly": True},
                {"name": "vm", "mountPath": "/vm"},
                {"name": "config", "mountPath": "/etc/zjusct", "readOnly": True},
                {"name": "tun", "mountPath": "/dev/net/tun"},
                {"name": "run", "mountPath": "/run/zjusct"},
                *extra_mounts,
            ],
        }],
        "volumes": [
            {"name": "images", "hostPath": {"path": cfg.image_dir, "type": "Directory"}},
            vm_volume,
            {"name": "config", "downwardAPI": {"items": config_items}},
            {"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}},
            {"name": "run", "emptyDir": {"medium": "Memory"}},
            *extra_volumes,
        ],
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    lost_node = [dict(t) for t in LAUNCHER_TOLERATIONS if t not in cfg.tolerations]
    pod_spec["tolerations"] = [*cfg.tolerations, *lost_node]
    labels = {"app.kubernetes.io/name": "zjusct-launcher", LABEL_MANAGED_BY: MANAGED_BY,
              LABEL_VM: md["name"], LABEL_BOOT: str(boot), OWNER_LABEL: spec["owner"]}
    group = spec.get("antiAffinityGroup")
    if group:
        # the owner's launcher Pods of the group, in every namespace: only the controller writes these labels (the
        # launcher-pod policy), so another owner's VMs, whatever their group, neither match nor are matched
        labels[LABEL_ANTI_AFFINITY_GROUP] = group
        pod_spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {OWNER_LABEL: spec["owner"], LABEL_ANTI_AFFINITY_GROUP: group}},
            "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}
    metadata: dict[str, Any] = {"name": name, "namespace": md["namespace"], "labels": labels,
                                "annotations": annotations, "ownerReferences": [owner_reference(vm)]}
    if rbd:
        metadata["finalizers"] = [POD_FINALIZER]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


# --------------------------------------------------------------------------- observing a Pod


def boot_of(pod: dict) -> Optional[int]:
    """The bootID a launcher Pod runs (its label), or None when the label is missing or not an integer."""
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {})[LABEL_BOOT])
    except (KeyError, TypeError, ValueError):
        return None


def _container_state(pod: dict) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            return cs.get("state") or {}
    return {}


def _condition(obj: dict, kind: str) -> Optional[dict]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def unschedulable(pod: dict) -> Optional[str]:
    """The scheduler's message when the Pod is not bound and its ``PodScheduled`` condition is False with reason
    ``Unschedulable`` (e.g. "0/3 nodes are available: 1 Insufficient cloud.zjusct.io/bandwidth-mbps, ..."), else
    None."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    cond = _condition(pod, "PodScheduled")
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return str(cond.get("message") or "no node fits")


def moved_away(pod: dict) -> Optional[str]:
    """The DisruptionTarget reason (one of :data:`MOVE_REASONS`) when ``pod`` is being deleted so that it runs
    elsewhere (an eviction, the taint manager), else None. The API server sets the condition before it marks the
    Pod deleted (KEP-3329, GA in Kubernetes 1.31)."""
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    cond = _condition(pod, "DisruptionTarget")
    if cond is None or cond.get("status") != "True" or cond.get("reason") not in MOVE_REASONS:
        return None
    return str(cond["reason"])


def pod_rbd(pod: dict) -> Optional[dict]:
    """The ``rootDisk.rbd`` of the LauncherConfig a launcher Pod carries (annotation :data:`CONFIG_ANNOTATION`):
    the image that Pod's launcher opens, or None (not RBD, or no readable config)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_ANNOTATION)
    try:
        rbd = ((json.loads(raw or "") or {}).get("rootDisk") or {}).get("rbd")
    except (ValueError, AttributeError):
        return None
    return rbd if isinstance(rbd, dict) and rbd.get("pool") and rbd.get("image") else None


def fence_targets(older: list, nodes: dict, rbd: Optional[dict], cfg: Config) -> tuple[list, str]:
    """Which launcher Pods to fence (older boots before the current boot may start; every boot's when the VM is
    stopped or deleted), and what blocks it.

    A Pod is fenced when it has not ended, is bound to a Node that is not Ready (or is gone) and that Node
    carries :data:`OUT_OF_SERVICE_TAINT`; a gone Node counts as out of service (deleted by the operator). The image
    is the one the Pod's own LauncherConfig names (:func:`pod_rbd`), else ``rbd``.

    Args:
        older: launcher Pods that must end (older boots, or the current one of a VM stopped or deleted).
        nodes: node name -> Node dict or None.
        rbd: the current boot's ``rootDisk.rbd`` (:func:`rbd_root_disk`), None when not known or not RBD.
        cfg: the controller config (``ceph.fenceUser``/``fenceKeyring`` = fencing configured).

    Returns:
        ``(targets, note)``: ``targets`` is a list of ``{"pod", "uid", "node", "podIP", "pool", "image"}`` (``podIP``
        None when the Pod never reported one) for :class:`Plan` ``fence``; ``note`` (may be empty) tells the
        operator why a Pod on a lost node is not fenced (no taint, not RBD, fencing not configured).
    """
    targets, notes = [], []
    for p in older:
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            continue
        if observe(p, node_ready(nodes.get(node))).state != "unknown":
            continue
        name = p["metadata"]["name"]
        image = pod_rbd(p) or rbd
        if nodes.get(node) is not None and not out_of_service(nodes[node]):
            notes.append(f"launcher Pod {name} is on node {node}, which is not Ready: once the node is off, taint it "
                         f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute to fence the old boot")
        elif image is None:
            notes.append(f"launcher Pod {name} on the out-of-service node {node} cannot be fenced: the root disk is "
                         "not an RBD image; delete the Pod (--force) once the node is surely off")
        elif cfg.ceph is None or not cfg.ceph.fence_user:
            notes.append(f"launcher Pod {name} on the out-of-service node {node} cannot be fenced: the controller "
                         "config has no ceph.fenceUser/fenceKeyring")
        else:
            targets.append({"pod": name, "uid": p["metadata"].get("uid"), "node": node,
                            "podIP": (p.get("status") or {}).get("podIP") or None,
                            "pool": image["pool"], "image": image["image"]})
    return targets, "; ".join(notes)


def fencing_note(targets: list) -> str:
    """The status message's note on the fences a plan carries (:func:`fence_targets`' targets), "" for none."""
    if not targets:
        return ""
    return "fencing " + ", ".join(f"launcher Pod {t['pod']} on the out-of-service node {t['node']}"
                                  for t in targets) + " (RBD blocklist, then the Pod is removed)"


def parse_result(message: Optional[str]) -> Optional[dict]:
    """The LauncherResult in a termination message, or None when it is missing or not one."""
    try:
        doc = json.loads(message or "")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "LauncherResult" else None


def observe(pod: dict, ready_node: Optional[bool]) -> BootObservation:
    """Reduce one launcher Pod (and its Node's readiness) to a :class:`model.phase.BootObservation`.

    * container terminated (or Pod Succeeded/Failed on a Ready node, or never bound): ``exited`` with the
      LauncherResult of the termination message; without a result (SIGKILL, OOM, the container was killed) ``lost``;
    * Pod bound to a Node that is not Ready (or whose Node is gone): ``unknown`` (the launcher may still run);
    * container running: ``alive``; ``ready_at`` = when the Pod's Ready condition (the launcher's ready marker,
      i.e. the guest's SSH banner answered) became True;
    * otherwise (not yet scheduled, image or volume being set up): ``starting``.
    """
    md, st, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
    boot = boot_of(pod) or 0
    node = spec.get("nodeName")
    state = _container_state(pod)
    started_at = (state.get("running") or {}).get("startedAt") or (state.get("terminated") or {}).get("startedAt")
    term = state.get("terminated")
    # a terminal phase without a terminated container, on a node that does not answer, is the pod GC's mark before
    # its force-delete (gcTerminating, gcOrphaned), not the kubelet's report: the launcher may still run
    kubelet_terminal = st.get("phase") in ("Succeeded", "Failed") and not (node and ready_node is not True)
    if term is not None or kubelet_terminal:
        term = term or {}
        result = parse_result(term.get("message"))
        if result is not None:
            return BootObservation(boot, "exited", ready_at=result.get("readyAt"), started_at=started_at,
                                   result=result, node=node)
        detail = (f"launcher Pod {md.get('name')} ended without a LauncherResult (container exit code "
                  f"{term.get('exitCode', '-')}, reason {term.get('reason') or st.get('reason') or '-'})")
        return BootObservation(boot, "lost", started_at=started_at, node=node, detail=detail)
    if node and ready_node is not True:
        return BootObservation(boot, "unknown", started_at=started_at, node=node,
                               detail=f"node {node} is {'missing' if ready_node is None else 'not Ready'};"
                                      f" the launcher of boot {boot} cannot be observed")
    if state.get("running") is not None:
        ready = _condition(pod, "Ready")
        ready_at = ready.get("lastTransitionTime") if ready and ready.get("status") == "True" else None
        return BootObservation(boot, "alive", ready_at=ready_at, started_at=started_at, node=node)
    return BootObservation(boot, "starting", node=node)


def releasable(pod: dict, ready_node: Optional[bool]) -> bool:
    """True when a terminating launcher Pod's finalizer :data:`POD_FINALIZER` may go: its launcher is known to
    have ended, so the Pod is no longer the record of an RBD client that may write.

    Known ended: the kubelet reported the container terminated; or the Pod was never bound to a node; or its node
    is Ready and the kubelet has finished with the Pod (phase Succeeded/Failed, or a deletion with grace period 0,
    which the kubelet on a Ready node carries out by killing what still runs). A Pod bound to a node that is not
    Ready, whose container the kubelet last reported running or starting, is kept: only a fence
    (:func:`fence_targets`) or the node's return releases it.

    Args:
        pod: the launcher Pod (with ``metadata.deletionTimestamp`` for a True answer).
        ready_node: :func:`node_ready` of its node (None: no such Node).
    """
    md, st = pod.get("metadata") or {}, pod.get("status") or {}
    if not md.get("deletionTimestamp"):
        return False
    if _container_state(pod).get("terminated") is not None or not (pod.get("spec") or {}).get("nodeName"):
        return True
    return ready_node is True and (st.get("phase") in ("Succeeded", "Failed")
                                   or md.get("deletionGracePeriodSeconds") == 0)


# --------------------------------------------------------------------------- the decision


@dataclass
class Plan:
    """What one reconcile does, in order: finalizer, PVC mark, deletes, create, then the status.

    Attributes:
        add_finalizer / remove_finalizer: the CloudVM's :data:`FINALIZER`.
        mark_claim: annotate the root volume claim with :data:`CLAIMED_BY` = the VM's uid.
        delete_pods: ``(name, grace_seconds)`` of launcher Pods to delete.
        fence: launcher Pods of older boots on an out-of-service node (:func:`fence_targets`): the adapter
            blocklists their RBD client and only then force-deletes each Pod (grace 0); a failed blocklist leaves
            the Pod, so the new boot stays blocked. Never together with ``create_pod``.
        release_pods: ``(name, uid, finalizers)`` of terminating launcher Pods whose finalizer :data:`POD_FINALIZER`
            the adapter removes (:func:`releasable`; ``finalizers`` the Pod's list as read, for the patch's test).
        create_pod: the Pod manifest to create, or None.
        status: the full status to write (None: the CloudVM is being deleted and is left as it is).
        refused: the reason (:data:`REFUSAL_REASONS`) when a write of this reconcile was refused (set by
            :func:`refuse` and by the adapter): the VM is retried with backoff (:func:`retry_delay`).
    """

    add_finalizer: bool = False
    remove_finalizer: bool = False
    mark_claim: bool = False
    delete_pods: list = field(default_factory=list)
    fence: list = field(default_factory=list)
    release_pods: list = field(default_factory=list)
    create_pod: Optional[dict] = None
    status: Optional[dict] = None
    refused: str = ""


def owner_problem(owner: str, claim: dict, volume: Optional[dict]) -> Optional[str]:
    """Why the root volume claim (and its PersistentVolume, when read) is not ``owner``'s, or None.

    The owner mark is the label :data:`OWNER_LABEL` (``root_volume_claim`` writes it on the claim and the PV
    after checking the RBD image's own mark). A claim or PV that carries another owner's mark belongs to that
    owner: a CloudVM of ``owner`` that names it would boot another tenant's disk (docs/security.md, threat model).
    An object without the mark is not judged here (an operator's own volume, e.g. pre-bound by hand).

    Returns:
        A message naming the object, the field, both owners and what to do; None when no mark disagrees.
    """
    md = claim.get("metadata") or {}
    marked = [(f"PersistentVolumeClaim {md.get('namespace')}/{md.get('name')}", claim)]
    if volume is not None:
        marked.append((f"PersistentVolume {(volume.get('metadata') or {}).get('name')}", volume))
    for what, obj in marked:
        mark = ((obj.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL)
        if mark is not None and mark != owner:
            return (f"the root volume claim {md.get('name')} belongs to owner {mark} ({what} "
                    f"metadata.labels[{OWNER_LABEL}]), not to {owner} (spec.owner): a CloudVM boots only its "
                    f"owner's volumes; name a claim of {owner} in spec.rootVolumeClaim")
    return None


def _claim_problem(vm: dict, claim: Optional[dict], writers: list[str], volume: Optional[dict], cfg: Config,
                   ) -> tuple[Optional[str], bool, str, Optional[dict]]:
    """``(problem, mark, reason, rbd)``: why the root volume claim cannot be used (None: it can), whether to mark
    it, and for a Block claim the launcher's ``rootDisk.rbd`` (:func:`rbd_root_disk`).

    ``reason``: ``VolumeClaimNotReady`` (missing or not Bound yet, its PV missing), ``VolumeOwnerMismatch`` (the
    claim or its PV carries another owner's mark, :func:`owner_problem`), ``VolumeInUse`` (claimed by another
    CloudVM uid, or used by a Pod that is not this VM's launcher) or ``VolumeNotSupported``.
    """
    spec = with_defaults(vm.get("spec") or {})
    name = spec["rootVolumeClaim"]
    if claim is None:
        return f"the root volume claim {name} does not exist", False, "VolumeClaimNotReady", None
    foreign = owner_problem(spec["owner"], claim, volume)
    if foreign:
        return foreign, False, "VolumeOwnerMismatch", None
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Bound":
        return (f"the root volume claim {name} is {phase or 'not bound'} (waiting until it is Bound)", False,
                "VolumeClaimNotReady", None)
    holder = ((claim.get("metadata") or {}).get("annotations") or {}).get(CLAIMED_BY)
    uid = vm["metadata"]["uid"]
    if holder and holder != uid:
        return (f"the root volume claim {name} is claimed by CloudVM uid {holder} ({CLAIMED_BY})", False,
                "VolumeInUse", None)
    if writers:
        return f"Pod {', '.join(sorted(writers))} uses the root volume claim {name}", False, "VolumeInUse", None
    rbd = None
    if is_block_claim(claim):
        try:
            rbd = rbd_root_disk(claim, volume, cfg)
        except VolumeProblem as exc:
            return exc.message, False, exc.reason, None
    return None, holder != uid, "", rbd


def _conditions(prev: list, phase: str, reason: str, message: str, generation: int, now: str) -> list:
    """The Ready condition (True only in Running); lastTransitionTime kept while its status is unchanged."""
    status = "True" if phase == "Running" else "False"
    old = next((c for c in prev or [] if c.get("type") == "Ready"), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get(
        "lastTransitionTime") else now
    return [{"type": "Ready", "status": status, "reason": reason or phase, "message": message[:32768],
             "lastTransitionTime": since, "observedGeneration": generation}]


def decide(vm: dict, pods: list, nodes: dict, claim: Optional[dict], claim_writers: list, cfg: Config,
           now: str, volume: Optional[dict] = None) -> Plan:
    """The next step for one CloudVM.

    Args:
        vm: the CloudVM (with ``metadata.uid``, ``generation``).
        pods: every launcher Pod labelled with this VM (:data:`LABEL_VM`), any boot.
        nodes: node name -> Node dict (or None when the Node does not exist) for the Pods' nodes and the node
            ``status.node`` names.
        claim: the PVC named by ``spec.rootVolumeClaim`` in the VM's namespace, or None.
        claim_writers: names of Pods not belonging to this VM that mount the claim or name it in their
            :data:`ROOT_CLAIM` annotation, and have not ended.
        cfg: the launcher defaults.
        now: the current time (RFC 3339), for condition transition times.
        volume: the claim's PersistentVolume when :func:`needs_volume` says it is needed (a Block claim: the RBD
            image, :func:`rbd_root_disk`), else None.

    Returns:
        A :class:`Plan`. Rules: one launcher Pod per (VM, bootID), created only when ``powerState`` is Running,
        the VM is not being deleted, no Pod of this boot was ever created (``status.pod`` of this boot records
        it), no older boot's launcher may still run or cannot be observed, and the root volume claim is Bound
        and not used by another CloudVM or Pod. Pods of older boots, and the current one when the VM should be
        off or is deleted, are deleted with the grace period that lets the launcher stop the guest. A Pod of
        the current boot deleted by someone else while the VM should run is ``Failed/LauncherLost``, except an
        eviction (:func:`moved_away`): ``Stopping/Evicted`` while the launcher stops the guest, and once that
        Pod is gone from a node that is Ready, the boot's Pod is created again (the one exception to "never
        twice": the old Pod ended by a graceful stop on a node that answers, so its guest is off).
    """
    md = vm["metadata"]
    spec = with_defaults(vm.get("spec") or {})
    prev = dict(vm.get("status") or {})
    boot = int(spec["bootID"])
    want = spec["powerState"] == "Running"
    deleting = bool(md.get("deletionTimestamp"))
    grace = int(cfg.stop_timeout_s) + GRACE_MARGIN_S
    plan = Plan()

    def obs(p: dict) -> BootObservation:
        n = (p.get("spec") or {}).get("nodeName")
        return observe(p, node_ready(nodes.get(n)) if n else None)

    current_pods = [p for p in pods if boot_of(p) == boot]
    older = sorted((p for p in pods if boot_of(p) != boot), key=lambda p: boot_of(p) or 0)
    cur = current_pods[0] if current_pods else None

    ending = older + ([cur] if cur is not None and (deleting or not want) else [])
    for p in ending:
        # a Pod on a lost node is not deleted: a terminating Pod on an out-of-service node is force-deleted by
        # the pod GC (its finalizer, POD_FINALIZER, keeps it), and a Pod without the finalizer would be gone with
        # the record of the RBD client to fence; it is deleted once its node is back, or after the fence (Plan.fence)
        if not (p.get("metadata") or {}).get("deletionTimestamp") and obs(p).state != "unknown":
            plan.delete_pods.append((p["metadata"]["name"], grace))
    for p in pods:
        pmd = p.get("metadata") or {}
        node_name = (p.get("spec") or {}).get("nodeName")
        if POD_FINALIZER in (pmd.get("finalizers") or []) and releasable(
                p, node_ready(nodes.get(node_name)) if node_name else None):
            plan.release_pods.append((pmd["name"], pmd.get("uid"), list(pmd.get("finalizers") or [])))
    fence_note = ""
    if deleting or not want:  # a stop or a deletion waits on a launcher of an out-of-service node: fence it
        plan.fence, fence_note = fence_targets(ending, nodes, None, cfg)

    if deleting:
        plan.remove_finalizer = not pods and FINALIZER in (md.get("finalizers") or [])
        return plan
    plan.add_finalizer = FINALIZER not in (md.get("finalizers") or [])

    others = tuple(obs(p) for p in older)
    recorded = prev.get("bootID") == boot and bool(prev.get("pod"))  # a Pod of this boot was created before
    # the boot's evicted Pod is gone and its node answers: its guest was stopped, the boot starts again elsewhere
    moving = (recorded and want and cur is None and being_moved(prev)
              and node_ready(nodes.get(str(prev.get("node")))) is True)
    name = pod_name(md["name"], boot)
    extra: dict[str, Any] = {}
    status: Status
    if cur is not None:
        current = obs(cur)
        evicted = moved_away(cur) if want and current.state != "unknown" and (
            current.state != "exited" or (current.result or {}).get("reason") in STOP_OUTCOMES) else None
        being_deleted = want and bool((cur.get("metadata") or {}).get("deletionTimestamp"))
        if being_deleted and current.state not in ("exited", "unknown"):
            current = BootObservation(boot, "lost", started_at=current.started_at, node=current.node,
                                      detail=f"launcher Pod {name} is being deleted while the VM should run")
        elif being_deleted and current.state == "exited":
            result = current.result or {}
            # the outcome of a stop (graceful or by force) that was not ours: someone deleted the Pod
            if result.get("reason") in STOP_OUTCOMES:
                current = BootObservation(boot, "lost", started_at=current.started_at, node=current.node,
                                          detail=f"launcher Pod {name} was deleted while the VM should run")
        status = derive_status(spec, current, others)
        if evicted is not None:
            status = Status("Stopping", EVICTED,
                            f"launcher Pod {name} is evicted from node {current.node} ({evicted}): the guest is "
                            f"stopped, then boot {boot} starts again on a node the scheduler picks", boot,
                            node=current.node, started_at=current.started_at)
        if current.state == "starting" and (status.phase, status.reason) == ("Pending", "Starting"):
            # created (and perhaps bound), its container not started: the status the create wrote stands, so
            # the scheduler's binding costs no status write; the node is recorded once the container runs
            status = Status("Pending", "Starting", f"boot {boot} requested", boot)
        why = unschedulable(cur) if (status.phase, status.reason) == ("Pending", "Starting") else None
        if why is not None:  # the scheduler's verdict, e.g. not enough cloud.zjusct.io/bandwidth-mbps anywhere
            status.reason, status.message = "Unschedulable", f"launcher Pod {name} cannot be scheduled: {why}"
            if spec.get("antiAffinityGroup") and "anti-affinity" in why:
                status.message += (f" (spec.antiAffinityGroup {spec['antiAffinityGroup']!r}: running VMs of owner "
                                   f"{spec['owner']} in this group never share a node)")
        extra["pod"] = name
        pod_ip = (cur.get("status") or {}).get("podIP")
        if status.phase == "Running" and pod_ip:
            extra["sshEndpoint"] = {"host": pod_ip, "port": SSH_PORT}
    elif recorded and not moving:
        extra["pod"] = prev["pod"]
        if prev.get("phase") in ("Stopped", "Failed"):  # the boot ended and was recorded; the Pod is gone since
            status = Status(prev["phase"], prev.get("reason", ""), prev.get("message", ""), boot,
                            node=prev.get("node"), started_at=prev.get("startedAt"),
                            ssh_ready_at=prev.get("sshReadyAt"), exit_result=prev.get("exitResult"))
        elif not want:
            status = Status("Stopped", "StopRequested", f"the launcher Pod of boot {boot} is gone after the stop",
                            boot, node=prev.get("node"), started_at=prev.get("startedAt"))
        else:
            status = derive_status(spec, BootObservation(
                boot, "lost", node=prev.get("node"), started_at=prev.get("startedAt"),
                detail=f"launcher Pod {prev['pod']} of boot {boot} is gone without a result"), others)
    elif want:
        problem, mark, why, rbd = _claim_problem(vm, claim, claim_writers, volume, cfg)
        status = derive_status(spec, None, others, volume_writer=problem)
        if status.phase == "Blocked" and status.reason == "VolumeInUse" and problem:  # the claim's own reason
            status.reason, status.message = why, problem
        if status.reason == "PreviousBootRunning":  # an older boot on a lost node: fence it, or say why not
            if rbd is None and claim is not None and is_block_claim(claim) and volume is not None:
                try:  # the image even when the claim is blocked for the old launcher's sake
                    rbd = rbd_root_disk(claim, volume, cfg)
                except VolumeProblem:
                    rbd = None
            plan.fence, note = fence_targets(older, nodes, rbd, cfg)
            note = fencing_note(plan.fence) or note
            if note:
                status.message = f"{status.message}; {note}"
        if status.phase == "Pending":
            plan.mark_claim = mark
            plan.create_pod = launcher_pod(vm, cfg, rbd)
            extra["pod"] = name
    else:
        alive = [o for o in others if o.state in ("alive", "starting", "unknown")]
        if alive:
            status = derive_status(spec, alive[-1], others)
        elif prev.get("phase") in ("Stopped", "Failed") and prev.get("bootID") is not None:
            status = Status(prev["phase"], prev.get("reason", ""), prev.get("message", ""), int(prev["bootID"]),
                            node=prev.get("node"), started_at=prev.get("startedAt"),
                            ssh_ready_at=prev.get("sshReadyAt"), exit_result=prev.get("exitResult"))
            extra.update({k: prev[k] for k in ("pod",) if prev.get(k)})
        else:
            status = derive_status(spec, None, others)
    fence_note = fencing_note(plan.fence) or fence_note
    if fence_note and not want and fence_note not in status.message:  # a kept message may carry it already
        status.message = f"{status.message}; {fence_note}"
    status.extra.update(extra)
    out = status.as_dict()
    admitted = boot if plan.create_pod is not None else admitted_boot(prev)
    if admitted is not None:  # kept in every status: the quota counts the VM from its first admitted boot on
        out[ADMITTED_FIELD] = admitted
    generation = int(md.get("generation") or 0)
    out["observedGeneration"] = generation
    out["message"] = out.get("message", "")[:4096]
    out["conditions"] = _conditions(prev.get("conditions") or [], out["phase"], out["reason"], out["message"],
                                    generation, now)
    plan.status = out
    return plan


def status_patch(prev: dict, new: dict) -> Optional[dict]:
    """The JSON merge patch turning ``prev`` into ``new`` (keys gone become None), or None when equal."""
    if prev == new:
        return None
    patch: dict[str, Any] = {k: v for k, v in new.items() if prev.get(k) != v}
    patch.update({k: None for k in prev if k not in new})
    return patch


def transition_event(prev: dict, new: dict) -> Optional[tuple[str, str, str]]:
    """``(type, reason, message)`` of the Kubernetes Event for a phase or reason change, or None.

    Warning for Failed, Unknown and Blocked and for a refused write (:data:`REFUSAL_REASONS`, any phase); Normal
    otherwise. The reason is the new status reason.
    """
    if (prev.get("phase"), prev.get("reason"), prev.get("bootID")) == (
            new.get("phase"), new.get("reason"), new.get("bootID")):
        return None
    kind = "Warning" if new.get("phase") in ("Failed", "Unknown", "Blocked") or new.get(
        "reason") in REFUSAL_REASONS else "Normal"
    message = (f"boot {new.get('bootID')}: {prev.get('phase') or '(none)'} -> {new.get('phase')}: "
               f"{new.get('message', '')}")
    return kind, new.get("reason") or new.get("phase") or "Unknown", message[:1024]


# --------------------------------------------------------------------------- refused writes

QUOTA_EXCEEDED = "QuotaExceeded"
REFUSED = "Refused"
REFUSAL_REASONS = (QUOTA_EXCEEDED, REFUSED)  # status reasons of a write the API server (or the quota) refused
REFUSAL_CODES = (400, 403, 422)  # BadRequest, Forbidden (quota, LimitRange, admission, RBAC), Invalid
# kube-apiserver's own wording (k8s.io/apiserver .../admission/plugin/resourcequota/controller.go and
# plugin/pkg/admission/limitranger/admission.go): the namespace's ResourceQuota or LimitRange refused the object
_QUOTA_WORDS = re.compile(r"exceeded quota: |failed quota: |(minimum|maximum) \S+ usage per \S+ is |"
                          r"max limit to request ratio per ")
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0


def api_refusal(code: Optional[int], body: Optional[str], what: str) -> Optional[tuple[str, str]]:
    """``(reason, message)`` for a write the API server refused for good (HTTP 400, 403 or 422), None otherwise
    (conflicts, 404, throttling, server errors and lost connections are retried as they are).

    ``reason`` is :data:`QUOTA_EXCEEDED` when the namespace's ResourceQuota or LimitRange refused (the API
    server's wording, ``exceeded quota: ...``, ``minimum memory usage per Container is ...``), else :data:`REFUSED`
    (an admission policy or webhook, Pod Security, RBAC, an invalid object). ``message`` names ``what`` was
    written, the HTTP code and the API server's own message (its Status ``message``, else the body).
    """
    if code not in REFUSAL_CODES:
        return None
    text = ""
    try:
        doc = json.loads(body or "")
        if isinstance(doc, dict):
            text = str(doc.get("message") or "")
    except ValueError:
        pass
    text = text or (body or "").strip() or "no message"
    reason = QUOTA_EXCEEDED if code == 403 and _QUOTA_WORDS.search(text) else REFUSED
    return reason, f"the API server refused {what} (HTTP {code}): {text}"


def refuse(vm: dict, plan: Plan, reason: str, message: str, now: str, starting: bool = True) -> Plan:
    """``plan`` after a refusal: no claim mark and no launcher Pod, and a status that says why.

    ``starting`` (the refusal is of the boot's own start: the quota, the claim mark, the Pod, the finalizer of a VM
    about to start):
    phase ``Blocked`` with ``reason``/``message``, no ``pod`` (no Pod of this boot exists, so the next reconcile
    tries again rather than call it lost) and ``admittedBootID`` as before the boot. Otherwise (a delete, the
    finalizer's removal) the phase stays and only the reason and message say what was refused. The Ready condition
    follows.
    """
    md = vm["metadata"]
    prev = dict(vm.get("status") or {})
    out = dict(plan.status if plan.status is not None else prev)
    if starting:
        out["phase"] = "Blocked"
        out.pop("pod", None)
        out.pop("node", None)
        out.pop("sshEndpoint", None)
        admitted = admitted_boot(prev)
        out.pop(ADMITTED_FIELD, None)
        if admitted is not None:
            out[ADMITTED_FIELD] = admitted
    out["reason"], out["message"] = reason, message[:4096]
    out.setdefault("bootID", int(with_defaults(vm.get("spec") or {})["bootID"]))
    out.setdefault("phase", "Pending")
    generation = int(md.get("generation") or 0)
    out["observedGeneration"] = generation
    out["conditions"] = _conditions(prev.get("conditions") or [], out["phase"], reason, out["message"],
                                    generation, now)
    return Plan(add_finalizer=plan.add_finalizer, remove_finalizer=plan.remove_finalizer if not starting else False,
                delete_pods=list(plan.delete_pods), fence=list(plan.fence),
                release_pods=list(plan.release_pods), status=out, refused=reason)


def retry_delay(attempt: int) -> float:
    """Seconds before retrying a VM whose last reconcile was refused or failed, after ``attempt`` such
    reconciles in a row (1, 2, ...): 2, 4, 8, ... up to 60 s, as client-go's per-item exponential backoff."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, int(attempt) - 1))


__all__ = ["BANDWIDTH_RESOURCE", "CEPH_CONF_ANNOTATION", "CLAIMED_BY", "FINALIZER", "GROUP", "LABEL_BOOT",
           "LABEL_VM", "OUT_OF_SERVICE_TAINT", "OWNER_LABEL", "PLURAL", "POD_FINALIZER", "QUOTA_EXCEEDED", "RBD_DRIVER",
           "REFUSAL_REASONS", "REFUSED", "ROOT_CLAIM", "VERSION", "CephConfig", "Config", "Plan", "VolumeProblem",
           "api_refusal", "decide", "fence_targets", "guaranteed_mbps", "is_block_claim", "launcher_pod",
           "needs_volume", "observe", "out_of_service", "owner_problem", "pod_name", "pod_rbd", "pod_resources",
           "rbd_root_disk", "refuse", "releasable", "retry_delay", "status_patch", "transition_event", "unschedulable"]
