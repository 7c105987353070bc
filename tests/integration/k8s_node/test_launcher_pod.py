"""The launcher image on the real node: a launcher Pod boots the real guest image under TCG, the guest answers SSH
from the test host at the Pod's IP, and deleting the Pod stops the guest gracefully with the LauncherResult as the
container's termination message.

One guest boot (minutes under TCG on a shared 2-core machine). Networking and privileges: see launcher_pod.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from tests.cluster import RealNode, wait_for
from tests.integration.k8s_node.launcher_pod import GUEST_IP, config_map, launcher_config, launcher_pod

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.guest, pytest.mark.slow, pytest.mark.timeout(2400)]
BOOT_TIMEOUT = 1500


def ssh_banner(host: str, port: int = 22, timeout: float = 5) -> str:
    """The first line the server sends ('' when nothing answers)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(256).decode(errors="replace").strip()
    except OSError:
        return ""


@pytest.fixture
def vm_dir(tmp_path: Path, guest_image: Any) -> Iterator[Path]:
    d = tmp_path / "vm"
    d.mkdir()
    subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(guest_image.rootfs), str(d / "root.raw")],
                   check=True, timeout=600)
    yield d


def test_launcher_pod_boots_guest_answers_ssh_and_delete_is_a_graceful_stop(
    real_node: RealNode, launcher_image: dict[str, Any], guest_image: Any, k8s_api: Any, k8s_namespace: str,
    vm_dir: Path, tmp_path: Path,
) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    cfg = launcher_config("podvm", guest_image.dir, guest_image.default_cmdline, (tmp_path / "id_ed25519.pub")
                          .read_text().strip())
    core.create_namespaced_config_map(k8s_namespace, config_map("podvm-launcher", cfg))
    core.create_namespaced_pod(k8s_namespace, launcher_pod("podvm", launcher_image["tag"],
                                                           real_node.pod_placement(), guest_image.dir, vm_dir,
                                                           "podvm-launcher"))

    def running_ip() -> str | None:
        pod = core.read_namespaced_pod("podvm", k8s_namespace)
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"launcher Pod ended early: {pod.status}")
        return pod.status.pod_ip if pod.status.phase == "Running" else None

    pod_ip = wait_for(running_ip, 120, "launcher Pod Running")

    def banner() -> str:
        pod = core.read_namespaced_pod("podvm", k8s_namespace)
        if pod.status.phase != "Running":
            raise AssertionError(f"launcher Pod left Running: {pod.status}")
        return ssh_banner(pod_ip)

    try:
        got = wait_for(banner, BOOT_TIMEOUT, f"SSH banner of the guest at {pod_ip}:22", interval=2)
    except BaseException:
        print(core.read_namespaced_pod_log("podvm", k8s_namespace)[-4000:])
        print((vm_dir / "serial.log").read_text(errors="replace")[-4000:])
        raise
    assert got.startswith("SSH-2.0-OpenSSH")
    ssh = ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=60", "-o", "LogLevel=ERROR", f"root@{pod_ip}",
           "hostname; ip -4 -o addr show dev eth0"]
    out = None
    for _ in range(6):  # sshd sends its banner slightly before it accepts logins under heavy load
        out = subprocess.run(ssh, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode == 0:
            break
        time.sleep(5)
    assert out is not None and out.returncode == 0, out.stderr if out else ""
    lines = out.stdout.splitlines()
    assert lines[0] == "podvm" and f"{GUEST_IP}/30" in lines[1]
    launcher_log = core.read_namespaced_pod_log("podvm", k8s_namespace)
    assert '"guest ready"' in launcher_log and '"accel": "tcg"' in launcher_log.replace('"accel":"tcg"',
                                                                                        '"accel": "tcg"')

    # graceful delete: SIGTERM to the launcher -> ACPI power button -> guest shutdown -> result -> message
    w = watch.Watch()
    terminated = None
    core.delete_namespaced_pod("podvm", k8s_namespace)
    try:
        for event in w.stream(core.list_namespaced_pod, k8s_namespace, field_selector="metadata.name=podvm",
                              timeout_seconds=400):
            pod = event["object"]
            for cs in pod.status.container_statuses or []:
                if cs.state and cs.state.terminated:
                    terminated = cs.state.terminated
            if terminated is not None or event["type"] == "DELETED":
                break
    finally:
        w.stop()
    assert terminated is not None, "no terminated container status before the Pod was deleted"
    result = json.loads(terminated.message)
    assert (terminated.exit_code, result["kind"], result["reason"], result["exitCode"]) == (
        0, "LauncherResult", "StopRequested", 0), result
    assert result["vm"]["name"] == "podvm" and result["readyAt"] and result["hypervisorExitStatus"] == 0
    on_disk = json.loads((vm_dir / "result-1.json").read_text())
    assert on_disk["reason"] == "StopRequested" and on_disk["finishedAt"] == result["finishedAt"]
    wait_for(lambda: not ssh_banner(pod_ip, timeout=2), 60, "guest gone")
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_config_map("podvm-launcher", k8s_namespace)
