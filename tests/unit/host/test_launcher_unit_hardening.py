"""The hardening of the launcher's transient systemd unit: systemd 252 accepts every property (systemd-analyze
verify of a unit file carrying them, no warning), and the writable paths are exactly the ones a run writes.

systemd is not PID 1 on these machines, so no launcher runs under the unit here (docs/security.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup

REPO = Path(__file__).resolve().parents[3]


def host_backend_config() -> dict:
    cfg = json.loads((REPO / "launcher" / "examples" / "config-qemu-tap.json").read_text())
    cfg["rootDisk"] = {"path": "/var/lib/zjusct-cloud/volumes/alice-root.raw"}
    cfg["hypervisor"]["runAs"] = {"uid": 1610612741, "gid": 1610612741}
    cfg["runtimeDir"] = "/run/zjusct-cloud/vms/default_alice"
    cfg["serialLogPath"] = "/var/log/zjusct-cloud/default_alice.serial.log"
    cfg["result"] = {"path": "/var/lib/zjusct-cloud/vms/default_alice/result-1.json"}
    cfg["readyMarkerPath"] = "/var/lib/zjusct-cloud/vms/default_alice/ready-1"
    return cfg


def test_properties_confine_writes_to_the_run_s_paths_and_keep_few_capabilities() -> None:
    cfg = host_backend_config()
    props = dict(p.split("=", 1) for p in sup.hardening_properties(cfg))
    writable = props["ReadWritePaths"].split()
    assert writable == ["-/run/zjusct-cloud/vms/default_alice", "-/var/lib/zjusct-cloud/vms/default_alice",
                        "-/var/lib/zjusct-cloud/volumes/alice-root.raw", "-/var/log/zjusct-cloud"]
    assert props["ProtectSystem"] == "strict" and props["NoNewPrivileges"] == "yes"
    assert "CAP_SYS_PTRACE" not in props["CapabilityBoundingSet"] and "CAP_SETUID" in props["CapabilityBoundingSet"]
    assert props["PrivateTmp"] == "yes"
    cfg["bootSlots"] = {"directory": "/run/lock/zjusct-cloud/boot-slots", "count": 2}
    props = dict(p.split("=", 1) for p in sup.hardening_properties(cfg))
    assert "-/run/lock/zjusct-cloud/boot-slots" in props["ReadWritePaths"].split(), "slot files made"
    cfg["runtimeDir"] = "/tmp/zj/run"
    assert "PrivateTmp" not in dict(p.split("=", 1) for p in sup.hardening_properties(cfg)), \
        "a private /tmp would hide the config's own paths"


def test_systemd_accepts_every_property(tmp_path: Path) -> None:
    cfg = host_backend_config()
    cfg["hypervisor"] = {"type": "firecracker", "runAs": {"uid": 1610612741, "gid": 1610612741},
                         "jailer": {"chrootBaseDir": "/var/lib/zjusct-cloud/jail"}}
    unit = tmp_path / "zjusct-launcher-default_alice-1.service"
    body = ["[Unit]", "Description=zjusct launcher (test)", "", "[Service]",
            "ExecStart=/usr/bin/python3 -m zjusct_launcher run --config /var/lib/zjusct-cloud/vms/x/boot-1.json",
            "KillMode=mixed", *sup.hardening_properties(cfg)]
    unit.write_text("\n".join(body) + "\n")
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and unit.name not in out.stderr + out.stdout, out.stderr
    assert "/var/lib/zjusct-cloud/jail" in unit.read_text()
