"""The launcher Pod of one boot, built from the CloudVM and the controller's :class:`.config.Config`: its name
(:func:`pod_name`), resources (:func:`pod_resources`), LauncherConfig (:func:`launcher_config`) and manifest
(:func:`launcher_pod`), and the labels, annotations, paths and network the controller and the launcher agree on
inside it. Pure: the manifest is a plain dict, created by :mod:`.reconcile`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import Placement
from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import (
    launcher_config as build_launcher_config,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import OUT_OF_SERVICE_TAINT
from ansible_collections.zjusct.cloud.plugins.module_utils.model.names import DNS1123_LABEL_MAX, TAP_PREFIX, fit
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    API_VERSION,
    FENCE_FINALIZER,
    KIND,
    OWNER_MARK,
    with_defaults,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network.hostnet import isolation_script

from .config import Config

LABEL_VM = "cloud.zjusct.io/vm"
LABEL_BOOT = "cloud.zjusct.io/boot-id"
# spec.antiAffinityGroup on the launcher Pod: with the owner label, what its required pod anti-affinity selects
LABEL_ANTI_AFFINITY_GROUP = "cloud.zjusct.io/anti-affinity-group"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "zjusct-controller"
CONFIG_ANNOTATION = "cloud.zjusct.io/launcher-config"
# PV and PVC label: the owner id of a root volume (root_volume_claim writes it); on a launcher Pod the CloudVM's
# spec.owner (a DNS label, so a valid label value), whom the launcher Pod policy of config/policy/owner-admission.yaml
# lets delete the Pod
OWNER_LABEL = OWNER_MARK
ROOT_CLAIM = "cloud.zjusct.io/root-claim"  # launcher Pod annotation: the root volume claim it writes
CEPH_CONF_ANNOTATION = "cloud.zjusct.io/ceph-conf"  # launcher Pod annotation: ceph.conf (monitors only, no key)
CEPH_CONF_PATH = "/etc/zjusct/ceph.conf"
KEYRING_DIR = "/etc/zjusct-ceph"
KEYRING_PATH = f"{KEYRING_DIR}/keyring"
KEYRING_SECRET_KEY = "keyring"  # noqa: S105 - the key of the Secret holding the Ceph keyring file
BOOT_SLOTS_MOUNT = "/run/zjusct-boot-slots"  # where a launcher Pod sees the node's boot slot directory
CONTAINER = "launcher"
# OUT_OF_SERVICE_TAINT (model.lifecycle, KEP-2268 non-graceful node shutdown): the operator's statement that a
# NotReady node is off (docs/controller.md Fencing). The launcher Pod tolerates it and the NoExecute taints of a lost
# node, so that Kubernetes neither evicts nor garbage-collects it: the Pod stays the record of the old RBD client
# until the controller fenced it.
# The finalizer of a launcher Pod with an RBD root disk. Kubernetes removes a Pod from a lost node by itself, whatever
# it tolerates, once the Pod is terminating (a stop, a drain, a newer boot asked for it before the node was lost): the
# pod GC marks it Failed and force-deletes it when the node is out of service (gcTerminating) or its Node object is
# gone (gcOrphaned), while its launcher may still write the image (a partitioned node). The finalizer keeps the Pod,
# the record of the RBD client to fence, until the controller knows its launcher ended (:func:`.observe.releasable`)
# or has fenced it (:attr:`.decide.Plan.fence`) - as the Job controller keeps its Pods with
# batch.kubernetes.io/job-tracking.
POD_FINALIZER = FENCE_FINALIZER
LAUNCHER_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": OUT_OF_SERVICE_TAINT, "operator": "Exists", "effect": "NoExecute"},
)
SSH_PORT = 22
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
    :func:`.volume.rbd_root_disk`) opened by QEMU's librbd (``/vm`` is then a Pod-local emptyDir); serial log and
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
    (:func:`.volume.rbd_root_disk`) the claim is not mounted: ``ceph.conf`` (monitors only) is the annotation
    :data:`CEPH_CONF_ANNOTATION` projected to :data:`CEPH_CONF_PATH`, the keyring is the ``keyring`` key of the
    Secret ``ceph.secretName`` mounted read-only (0400) at :data:`KEYRING_DIR`; no key is in the manifest; and the
    Pod carries the finalizer :data:`POD_FINALIZER` (the record of its RBD client until it ended or was fenced).

    restartPolicy Never (a Pod is one boot); the LauncherConfig is an annotation projected into
    ``/etc/zjusct/launcher.json`` by a downwardAPI volume (one object, created atomically); the LauncherResult is
    the container's termination message; readiness = the launcher's ready marker exists; grace period
    :attr:`.config.Config.grace_period_s` (``stop_timeout_s + 30``); ``NET_ADMIN`` and ``/dev/net/tun`` for the
    bridge, TAP and DNAT in the Pod's own netns, ``net.ipv4.ip_forward=1`` for that netns only (an unsafe sysctl the
    node must allow).

    Raises:
        ValueError: ``rbd`` is given but ``cfg`` has no ``ceph`` section.
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
        "terminationGracePeriodSeconds": cfg.grace_period_s,
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
