"""The launcher Pod of the real-node tests and bench: one boot of the real guest image under TCG in a Pod.

Networking (the simplest correct choice for a test node, see docs/testing-kubernetes.md): the Pod has its own
network namespace on the node's CNI bridge (its Pod IP is reachable from the host). Before the launcher starts,
the container makes a bridge ``br0`` with 10.0.3.1/30 in the Pod's netns and a DNAT of TCP port 22 arriving on
``eth0`` to the guest's 10.0.3.2; the launcher creates the guest's TAP on ``br0`` (``createTap``). The test host
then reaches the guest's sshd at ``<Pod IP>:22``. ``net.ipv4.ip_forward=1`` is set for the Pod's netns only
(Pod ``securityContext.sysctls``; the real node allows it with ``allowedUnsafeSysctls``).

Privileges: none beyond ``NET_ADMIN`` (bridge, TAP, nft in the Pod's own netns) and the ``/dev/net/tun``
character device (hostPath): runc's default device rules allow it. The Pod is not privileged; /dev/kvm would need
``privileged: true`` (devices cgroup), which these TCG-only machines do not use.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import TEST_BOOT_SLOT_DIR, boot_slots

BOOT_SLOTS_MOUNT = "/run/zjusct-boot-slots"  # the node's boot slot directory in the Pod (hostPath)
GUEST_IP = "10.0.3.2"
GUEST_CIDR = f"{GUEST_IP}/30"
POD_SIDE = "10.0.3.1"
NET_SETUP = f"""set -e
ip link add br0 type bridge
ip addr add {POD_SIDE}/30 dev br0
ip link set br0 up
nft -f - <<'NFT'
table ip zjusct_pod {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "eth0" tcp dport 22 dnat to {GUEST_IP}
  }}
}}
NFT
exec python3 -m zjusct_launcher run --config /etc/zjusct/launcher.json
"""


def launcher_config(name: str, image_dir: Path, cmdline: str, pubkey: str, *, boot_id: int = 1,
                    in_pod: bool = True, vm_dir: Path | None = None, memory_mib: int = 512) -> dict[str, Any]:
    """LauncherConfig v1 for the guest image set in ``image_dir`` (paths as the Pod sees them when ``in_pod``).

    In the Pod the image set is mounted at ``/images`` and the VM dir (root.raw, serial log, result) at ``/vm``;
    on the host (bench baseline) the real paths ``image_dir`` and ``vm_dir`` are used.
    """
    images = Path("/images") if in_pod else image_dir
    vm = Path("/vm") if in_pod else vm_dir
    assert vm is not None
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"zjusct-test/real-node/{name}"))
    return {
        "apiVersion": "launcher.cloud.zjusct.io/v1", "kind": "LauncherConfig",
        "vm": {"namespace": "test", "name": name, "uid": uid, "bootID": boot_id},
        "machine": {"vcpus": 1, "memoryMiB": memory_mib},
        "boot": {"kernel": str(images / "vmlinuz"), "initrd": str(images / "initrd.img"), "cmdline": cmdline},
        "rootDisk": {"path": str(vm / "root.raw"), "cache": "Writeback"},
        "identity": {"hostname": name, "instanceID": uid, "sshAuthorizedKeys": [pubkey]},
        "network": {"mode": "tap", "tap": "tap0", "createTap": True, "bridge": "br0", "mac": "52:54:00:0a:00:02",
                    "ipv4": GUEST_CIDR, "gateway": POD_SIDE, "dns": []},
        "hypervisor": {"type": "qemu", "accel": "tcg", "tcgTranslationCacheMiB": 128},
        "readiness": {"timeoutSeconds": 1500},
        "bootSlots": {**boot_slots(), "directory": BOOT_SLOTS_MOUNT} if in_pod else boot_slots(),
        "stopTimeoutSeconds": 120,
        "runtimeDir": "/run/zjusct/vm" if in_pod else str(vm / "run"),
        "serialLogPath": str(vm / "serial.log"),
        "result": {"path": str(vm / f"result-{boot_id}.json"),
                   "terminationMessagePath": "/dev/termination-log" if in_pod else None},
    }


def launcher_pod(name: str, image: str, placement: dict[str, Any], image_dir: Path, vm_dir: Path,
                 config_map: str) -> dict[str, Any]:
    """The Pod manifest: launcher image, NET_ADMIN + /dev/net/tun, image set and VM dir as hostPath volumes.

    ``placement``: spec fields that put it on the real node (``RealNode.pod_placement()``).
    """
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "zjusct-launcher"}},
        "spec": {
            **placement,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 200,  # > stopTimeoutSeconds: the guest shuts down, then the result
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_forward", "value": "1"}]},
            "containers": [{
                "name": "launcher",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", NET_SETUP],
                "securityContext": {"privileged": False, "capabilities": {"add": ["NET_ADMIN"]}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "resources": {"requests": {"cpu": "500m", "memory": "768Mi"}},
                "volumeMounts": [
                    {"name": "images", "mountPath": "/images", "readOnly": True},
                    {"name": "vm", "mountPath": "/vm"},
                    {"name": "config", "mountPath": "/etc/zjusct", "readOnly": True},
                    {"name": "tun", "mountPath": "/dev/net/tun"},
                    {"name": "run", "mountPath": "/run/zjusct"},
                    {"name": "boot-slots", "mountPath": BOOT_SLOTS_MOUNT},
                ],
            }],
            "volumes": [
                {"name": "images", "hostPath": {"path": str(image_dir), "type": "Directory"}},
                {"name": "vm", "hostPath": {"path": str(vm_dir), "type": "Directory"}},
                {"name": "config", "configMap": {"name": config_map}},
                {"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}},
                {"name": "run", "emptyDir": {"medium": "Memory"}},
                {"name": "boot-slots", "hostPath": {"path": TEST_BOOT_SLOT_DIR, "type": "DirectoryOrCreate"}},
            ],
        },
    }


def config_map(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A ConfigMap holding ``launcher.json``."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"launcher.json": json.dumps(config, indent=2)}}
