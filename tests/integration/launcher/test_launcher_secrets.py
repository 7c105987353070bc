"""No secret in any output: a launcher run with an RBD root disk and a cephx keyring hands QEMU the key through a
private file only. The key never appears in the launcher's log (the VMM's argv is logged), the result, the
termination message, the serial log or the VMM's command line (/proc/<pid>/cmdline, what ``ps`` shows).

The Ceph monitor named in the test's ceph.conf is a closed local port, so the real QEMU (rbd block driver from
qemu-block-extra) fails to connect after ``client_mount_timeout`` and the run ends HypervisorCrashed; what is
checked is everything written along the way, under the sandbox (runAs) as the host backend runs it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import Launched, base_config, leftovers

pytestmark = [pytest.mark.guest]


def test_cephx_key_never_leaves_the_private_file(tmp_path: Path) -> None:
    key = subprocess.run(["ceph-authtool", "--gen-print-key"], capture_output=True, text=True, check=True,
                         timeout=30).stdout.strip()
    assert key.startswith("AQ")
    keyring = tmp_path / "ceph.client.cloud.keyring"
    keyring.write_text(f"[client.cloud]\n\tkey = {key}\n")
    keyring.chmod(0o600)
    conf = tmp_path / "ceph.conf"
    conf.write_text("[global]\nmon_host = 127.0.0.1:9\nclient_mount_timeout = 5\nrados_mon_op_timeout = 5\n"
                    "auth_client_required = cephx\n")
    kernel, _ = bg.kernel()
    cfg = base_config(tmp_path, "bb-secret", kernel=kernel, initrd=bg.build_initrd(), disk="/unused",
                      cmdline="console=ttyS0")
    cfg["rootDisk"] = {"rbd": {"pool": "rbd", "image": "bb-secret-root", "conf": str(conf), "user": "cloud",
                               "keyringPath": str(keyring)}}
    cfg["hypervisor"]["runAs"] = {"uid": 1610612811, "gid": 1610612811}
    cfg["result"]["terminationMessagePath"] = str(tmp_path / "termination-log")
    vm = Launched(cfg, tmp_path)
    cmdlines: list[bytes] = []
    deadline = time.monotonic() + 120
    while vm.proc.poll() is None and time.monotonic() < deadline:  # the VMM's argv while it runs
        try:
            pid = vm.vmm_pid()
            cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    rc, result = vm.wait(300)
    assert rc == 1 and result is not None and result["reason"] == "HypervisorCrashed", result
    assert cmdlines, f"the VMM never ran:\n{vm.log_tail()}"
    argv = next(line["argv"] for line in vm.log_lines() if line.get("msg") == "vmm started")
    assert any("key-secret" in a for a in argv), "the rbd blockdev takes its key from a secret object"
    outputs = {
        "launcher log": vm.stderr_path.read_text(errors="replace"),
        "result": json.dumps(result),
        "termination message": (tmp_path / "termination-log").read_text(),
        "serial log": Path(cfg["serialLogPath"]).read_text(errors="replace")
        if Path(cfg["serialLogPath"]).exists() else "",
        "VMM command line": b" ".join(cmdlines).decode(errors="replace"),
    }
    for where, text in outputs.items():
        assert key not in text, f"the cephx key leaked into the {where}"
    assert leftovers(vm.runtime_dir) == [], "rbd.secret removed with the other runtime files"
