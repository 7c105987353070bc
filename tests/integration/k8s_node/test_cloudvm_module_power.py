"""The ``cloudvm`` module's power requests (backend kubernetes, through ``ansible-playbook``) against the real
controller on the real node, with the real launcher image and guest image: every phase the module waits for is the
one the controller writes from the launcher Pod and the guest (no stand-in writes status).

One test, two guest boots under TCG (minutes each on a shared 2-core machine), in this order:
start -> Running (boot 1); start again changes nothing; stop -> Stopped/StopRequested, stop again changes nothing;
restart from Stopped -> Running on boot 2 (bootID bumped once); the guest powers itself off -> Stopped/GuestShutdown
(boot 2); start twice (L7: the playbook retried) -> bootID 3 exactly once, and the controller creates boot 3's Pod.
The fixture (``env``: CRD, the root volume claim ``vm1-root``, the controller process with its RBAC) is the one of
test_controller.py.
"""
# ruff: noqa: F811  (the env fixture is imported and taken as a parameter of the same name)

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, wait_for
from tests.integration.cloudvm_k8s import cloudvm_helpers
from tests.integration.cloudvm_k8s.cloudvm_helpers import PlayRun, cloudvm_task, run_play
from tests.integration.k8s_node.test_controller import BOOT_TIMEOUT, Env, env  # noqa: F401  (fixture)
from tests.integration.k8s_node.test_launcher_pod import ssh_banner

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.guest, pytest.mark.slow,
              pytest.mark.timeout(2 * BOOT_TIMEOUT + 900)]
SSH_TIMEOUT = 120


def _ssh(key: Path, host: str, port: int, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as root on the guest (its key comes from spec.sshAuthorizedKeys); retried a few times, because
    sshd answers its banner slightly before it accepts logins under load."""
    argv = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=60", "-o", "LogLevel=ERROR",
            f"root@{host}", command]
    last: subprocess.CompletedProcess[str] | None = None
    for _ in range(5):
        last = subprocess.run(argv, capture_output=True, text=True, timeout=SSH_TIMEOUT, check=False)
        if last.returncode == 0:
            return last
        time.sleep(5)
    assert last is not None
    raise AssertionError(f"ssh {command!r} failed: {last.returncode} {last.stderr}")


def test_module_start_stop_restart_and_start_after_guest_shutdown_on_the_real_controller(
    env: Env, k8s_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cloudvm_helpers, "PLAY_TIMEOUT", 2 * BOOT_TIMEOUT)  # up to one TCG boot per play
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    vm_args = {"name": "vm1", "namespace": env.ns, "owner": "alice", "root_volume_claim": "vm1-root",
               "vcpus": 1, "memory_mib": 512, "ssh_authorized_keys": [pubkey], "wait_timeout": BOOT_TIMEOUT}

    def play(*tasks: dict[str, Any]) -> list[dict[str, Any]]:
        run = run_play([cloudvm_task(**vm_args, **t) for t in tasks], kubeconfig=k8s_cluster.kubeconfig,
                       tmp_path=tmp_path)
        assert isinstance(run, PlayRun)
        assert run.rc == 0, (run.stdout[-4000:], run.stderr[-2000:], env.controller.tail())
        return run.results

    # start -> Running (boot 1); a second start on the running VM changes nothing
    start, start_again = play({"power_state": "running"}, {"power_state": "running"})
    assert (start["changed"], start["boot_id"], start["phase"]) == (True, 1, "Running"), start
    endpoint = start["cloudvm"]["status"]["sshEndpoint"]
    assert ssh_banner(endpoint["host"], endpoint["port"]).startswith("SSH-2.0-OpenSSH")
    assert (start_again["changed"], start_again["boot_id"], start_again["phase"]) == (False, 1, "Running")
    assert env.vm("vm1")["metadata"]["generation"] == start["cloudvm"]["metadata"]["generation"]

    # stop -> Stopped (the launcher stopped the guest; the Pod is gone); stop again changes nothing
    stop, stop_again = play({"power_state": "stopped"}, {"power_state": "stopped"})
    assert (stop["changed"], stop["phase"]) == (True, "Stopped"), stop
    assert stop["cloudvm"]["status"]["reason"] == "StopRequested" and not stop.get("warnings"), stop
    assert (stop_again["changed"], stop_again["phase"]) == (False, "Stopped"), stop_again
    wait_for(lambda: not env.pods("vm1"), 300, "boot 1's launcher Pod gone")

    # restart from Stopped: one new boot, Running with bootID 2
    (restart,) = play({"restart": True})
    assert (restart["changed"], restart["boot_id"], restart["phase"]) == (True, 2, "Running"), restart
    assert [p.metadata.name for p in env.pods("vm1")] == ["vm1-boot-2"]
    endpoint = restart["cloudvm"]["status"]["sshEndpoint"]

    # the guest powers itself off: the controller reports boot 2 Stopped/GuestShutdown (the spec still says Running)
    _ssh(env.key, endpoint["host"], endpoint["port"], "nohup sh -c 'sleep 1; poweroff' >/dev/null 2>&1 &")
    down = env.status_when("vm1", lambda s: s.get("bootID") == 2 and s.get("phase") in ("Stopped", "Failed"),
                           600, "boot 2 ended")
    assert (down["status"]["phase"], down["status"]["reason"]) == ("Stopped", "GuestShutdown"), down["status"]
    assert down["status"]["exitResult"]["reason"] == "GuestShutdown", down["status"]
    assert (down["spec"]["powerState"], down["spec"]["bootID"]) == ("Running", 2)

    # L7: start after the guest's own shutdown, retried (the playbook run twice): bootID goes up exactly once
    first, retry = play({"power_state": "running", "wait": False}, {"power_state": "running", "wait": False})
    assert (first["changed"], first["boot_id"]) == (True, 3), first
    assert (retry["changed"], retry["boot_id"]) == (False, 3), retry
    assert env.vm("vm1")["spec"]["bootID"] == 3
    booting = env.status_when("vm1", lambda s: s.get("bootID") == 3 and bool(s.get("pod")), 120, "boot 3's Pod created")
    assert booting["status"]["pod"] == "vm1-boot-3", booting["status"]

    # what the controller wrote, in order: boot 1 stopped on request before boot 2 started; boot 2 shut down by the
    # guest before boot 3 was requested; no boot ever Failed
    seen = env.seen
    assert seen.index((1, "Stopped", "StopRequested")) < seen.index((2, "Running", "SSHReady")), seen
    assert seen.index((2, "Stopped", "GuestShutdown")) < min(i for i, s in enumerate(seen) if s[0] == 3), seen
    assert "Failed" not in [s[1] for s in seen], seen
