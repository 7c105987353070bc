"""The runner's Firecracker path end to end against a FAKE firecracker (no real one can run here: no usable KVM).

The fake speaks the documented surface only: ``--api-sock/--config-file/--id`` flags, the config-file fields, the
console on stdout, ``PUT /actions {"action_type": "SendCtrlAltDel"}`` -> 204, exit status 0 on a guest reset.
The KVM decision is forced to ``kvm`` in the launcher subprocess (the only patch); everything else is the real
launcher: lock, config file, console to serialLogPath, API stop, reason mapping, cleanup, result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]

FAKE = r'''
import json, os, socket, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
cfg = json.load(open(args["--config-file"]))
for key in ("boot-source", "drives", "machine-config", "network-interfaces"):
    if key not in cfg:
        sys.exit(3)
print("fake console:", cfg["boot-source"]["boot_args"], flush=True)
mode = os.environ.get("FAKE_FC_MODE", "obey")
if mode in ("reboot", "crash"):
    time.sleep(1)
    sys.exit(0 if mode == "reboot" else 148)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(args["--api-sock"])
srv.listen(4)
while True:
    conn, _ = srv.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
    while len(body) < length:
        body += conn.recv(4096)
    action = json.loads(body).get("action_type")
    conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    conn.close()
    if action == "SendCtrlAltDel" and mode == "obey":
        print("fake console: reset", flush=True)
        sys.exit(0)
'''

LAUNCH = ("import sys; from zjusct_launcher import runner; runner.Runner._decide_accel = lambda self, b: 'kvm'; "
          "from zjusct_launcher.cli import main; sys.exit(main(sys.argv[1:]))")


def setup(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    fake = tmp_path / "firecracker"
    fake.write_text(f"#!{sys.executable}\n{FAKE}")
    fake.chmod(0o755)
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(b"\x7fELF" + b"\0" * 60)
    disk = tmp_path / "root.raw"
    disk.write_bytes(b"\0" * 4096)
    cfg = json.loads((REPO / "launcher" / "examples" / "config-firecracker-tap.json").read_text())
    cfg["boot"] = {"kernel": str(kernel), "initrd": None, "cmdline": "console=ttyS0"}
    cfg["rootDisk"] = {"path": str(disk)}
    cfg["network"] = {"mode": "none"}
    cfg.pop("readiness")
    cfg["hypervisor"] = {"type": "firecracker", "binary": str(fake)}
    cfg["stopTimeoutSeconds"] = 3
    cfg["runtimeDir"] = str(tmp_path / "run")
    cfg["serialLogPath"] = str(tmp_path / "serial.log")
    cfg["result"] = {"path": str(tmp_path / "result.json"), "terminationMessagePath": str(tmp_path / "term")}
    cfg.pop("readyMarkerPath")
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"), FAKE_FC_MODE=mode)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "run", "--config", str(tmp_path / "cfg.json")],
                            env=env, stderr=subprocess.PIPE)
    return proc, cfg


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert path.exists(), f"{path} missing"


def outcome(proc: subprocess.Popen[bytes], cfg: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    _, err = proc.communicate(timeout=60)
    result = json.loads(Path(cfg["result"]["path"]).read_text())
    assert json.loads(Path(cfg["result"]["terminationMessagePath"]).read_text()) == result
    assert sorted(os.listdir(cfg["runtimeDir"])) == ["launcher.lock"], err.decode()
    return proc.returncode, result


def test_sigterm_sends_ctrl_alt_del_and_ends_stop_requested(tmp_path: Path) -> None:
    proc, cfg = setup(tmp_path, "obey")
    wait_for(tmp_path / "run" / "ready", proc)  # network none: ready when the VMM runs
    wait_for(tmp_path / "run" / "firecracker.sock", proc)
    written = json.loads((tmp_path / "run" / "firecracker.json").read_text())
    assert written["drives"][0]["cache_type"] == "Writeback"
    proc.send_signal(signal.SIGTERM)
    rc, result = outcome(proc, cfg)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    console = (tmp_path / "serial.log").read_text()
    assert "fake console: console=ttyS0 reboot=k pci=off" in console and "fake console: reset" in console


def test_ignored_ctrl_alt_del_is_killed_after_the_stop_timeout(tmp_path: Path) -> None:
    proc, cfg = setup(tmp_path, "ignore")
    wait_for(tmp_path / "run" / "firecracker.sock", proc)
    proc.send_signal(signal.SIGTERM)
    rc, result = outcome(proc, cfg)
    assert (rc, result["reason"], result["hypervisorExitStatus"]) == (1, "StopTimeoutKilled", 137), result


@pytest.mark.parametrize(("mode", "reason", "rc"), [("reboot", "GuestReboot", 0), ("crash", "HypervisorCrashed", 1)])
def test_unasked_exit_status_maps_to_a_reason(tmp_path: Path, mode: str, reason: str, rc: int) -> None:
    proc, cfg = setup(tmp_path, mode)
    got_rc, result = outcome(proc, cfg)
    assert (got_rc, result["reason"]) == (rc, reason), result
    if mode == "crash":
        assert "bad syscall" in result["message"] and result["hypervisorExitStatus"] == 148
