"""The runner's Firecracker path end to end against a FAKE firecracker (no real one can run here: no usable KVM).

The fake speaks the documented surface only: ``--api-sock/--config-file/--id`` flags, the config-file fields, the
console on stdout, ``PUT /actions {"action_type": "SendCtrlAltDel"}`` -> 204, exit status 0 on a guest reset.
The KVM decision is forced to ``kvm`` in the launcher subprocess (the only patch); everything else is the real
launcher: lock, config file, console to serialLogPath, API stop, reason mapping, cleanup, result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

REPO = Path(__file__).resolve().parents[3]

FAKE = r'''
import json, os, socket, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
def host(path):  # under the stand-in jailer, paths are relative to the jail (cwd) instead of a chroot
    return "." + path if os.environ.get("FAKE_FC_JAILED") else path
cfg = json.load(open(host(args["--config-file"])))
for key in ("boot-source", "drives", "machine-config", "network-interfaces"):
    if key not in cfg:
        sys.exit(3)
try:  # what Firecracker opens after the jailer's drop: kernel, initrd, drives (root disk read-write)
    open(host(cfg["boot-source"]["kernel_image_path"]), "rb").close()
    for drive in cfg["drives"]:
        open(host(drive["path_on_host"]), "rb" if drive["is_read_only"] else "r+b").close()
except OSError as exc:
    print("fake firecracker:", exc, file=sys.stderr, flush=True)
    sys.exit(3)
args["--api-sock"] = host(args["--api-sock"])
print("fake console:", cfg["boot-source"]["boot_args"], flush=True)
mode = os.environ.get("FAKE_FC_MODE", "obey")
if mode in ("reboot", "crash"):
    time.sleep(1)
    sys.exit(0 if mode == "reboot" else 148)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(args["--api-sock"])
time.sleep(float(os.environ.get("FAKE_FC_LISTEN_DELAY", "0")))  # bound, not yet listening: connect is refused
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
    print("fake console: action", action, flush=True)
    if action == "SendCtrlAltDel" and mode == "obey":
        print("fake console: reset", flush=True)
        sys.exit(0)
'''

# A stand-in for the jailer: checks its documented arguments and the prepared chroot, then does what it does
# minus the chroot itself (the stand-in firecracker is a Python script that needs the host's /usr): copy the
# exec file into <chroot base>/<exec name>/<id>/root, cd there, setgroups/setgid/setuid to --gid/--uid, exec the
# copy with "--id <id>" added.
FAKE_JAILER = r'''
import os, shutil, sys
argv = sys.argv[1:]
sep = argv.index("--")
opts, rest = argv[:sep], argv[sep + 1:]
pairs = list(zip(opts[0::2], opts[1::2]))
args = dict(pairs)
assert [v for k, v in pairs if k == "--cgroup"] == ["cpu.max=100000 100000"], pairs
assert args["--cgroup-version"] == "2", pairs
root = os.path.join(args["--chroot-base-dir"], os.path.basename(args["--exec-file"]), args["--id"], "root")
os.chdir(root)
exe = os.path.join(root, os.path.basename(args["--exec-file"]))
shutil.copy(args["--exec-file"], exe)
uid, gid = int(args["--uid"]), int(args["--gid"])
os.chown(exe, uid, gid)
os.setgroups([gid])
os.setgid(gid)
os.setuid(uid)
env = dict(os.environ, FAKE_FC_JAILED="1")
exe = "./" + os.path.basename(exe)  # relative to the jail, as after a chroot
os.execve(exe, [exe, *rest, "--id", args["--id"]], env)
'''

LAUNCH = ("import sys; from zjusct_launcher import vmm_firecracker; "
          "vmm_firecracker.FirecrackerVmm.decide_accel = lambda self, b: 'kvm'; "
          "from zjusct_launcher.cli import main; sys.exit(main(sys.argv[1:]))")


def setup(tmp_path: Path, mode: str, jailed: bool = False, stop_timeout_seconds: int = 60,
          listen_delay_seconds: float = 0, stop_retry_interval_seconds: int | None = None,
          ) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the real launcher on the fake. A guest that obeys ends the stop as soon as it answers, so only the
    test of an ignored stop needs a short stop timeout; the others keep a long one (a loaded machine)."""
    fake = tmp_path / "firecracker"
    # jailed, it runs as an unprivileged uid that may not reach the venv's interpreter (under /root here)
    fake.write_text(f"#!{'/usr/bin/python3' if jailed else sys.executable}\n{FAKE}")
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
    if jailed:
        jailer = tmp_path / "jailer"
        jailer.write_text(f"#!{sys.executable}\n{FAKE_JAILER}")
        jailer.chmod(0o755)
        # The unprivileged stand-in opens its own script by absolute path: the jail must be reachable for it,
        # which pytest's 0700 basetemp is not (the real one, chrooted, never walks the host's tree).
        base = Path(tempfile.mkdtemp(prefix="zjjail", dir=tmp_path.anchor + "tmp"))
        base.chmod(0o755)
        cfg["hypervisor"].update(runAs={"uid": RUN_AS, "gid": RUN_AS},
                                 jailer={"binary": str(jailer), "chrootBaseDir": str(base)})
        disk.chmod(0o600)
    cfg["stopTimeoutSeconds"] = stop_timeout_seconds
    if stop_retry_interval_seconds is not None:
        cfg["stopRetryIntervalSeconds"] = stop_retry_interval_seconds
    cfg["runtimeDir"] = str(tmp_path / "run")
    cfg["serialLogPath"] = str(tmp_path / "serial.log")
    cfg["result"] = {"path": str(tmp_path / "result.json"), "terminationMessagePath": str(tmp_path / "term")}
    cfg.pop("readyMarkerPath")
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"), FAKE_FC_MODE=mode,
               FAKE_FC_LISTEN_DELAY=str(listen_delay_seconds))
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "run", "--config", str(tmp_path / "cfg.json")],
                            env=env, stderr=subprocess.PIPE)
    return proc, cfg


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert path.exists(), f"{path} missing"


def outcome(proc: subprocess.Popen[bytes], cfg: dict[str, Any],
            log: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
    """The launcher's exit code and result (checked against its termination message and runtime dir); ``log``
    gets its stderr's JSON lines."""
    _, err = proc.communicate(timeout=60)
    if log is not None:
        log.extend(json.loads(line) for line in err.decode().splitlines() if line.startswith("{"))
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


def test_stop_before_the_api_listens_is_still_graceful(tmp_path: Path) -> None:
    """Firecracker binds its API socket, then listens: a stop in between is retried, not turned into a kill."""
    proc, cfg = setup(tmp_path, "obey", listen_delay_seconds=2)
    wait_for(tmp_path / "run" / "firecracker.sock", proc)
    proc.send_signal(signal.SIGTERM)
    log: list[dict[str, Any]] = []
    rc, result = outcome(proc, cfg, log)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    assert "fake console: reset" in (tmp_path / "serial.log").read_text()
    # the refused connects are not attempts: one request reached the API, and the guest obeyed it
    assert [x["attempt"] for x in log if x["msg"] == "graceful stop sent"] == [1], log


def test_ignored_ctrl_alt_del_is_repeated_then_killed_after_the_stop_timeout(tmp_path: Path) -> None:
    proc, cfg = setup(tmp_path, "ignore", stop_timeout_seconds=5, stop_retry_interval_seconds=1)
    wait_for(tmp_path / "run" / "firecracker.sock", proc)
    proc.send_signal(signal.SIGTERM)
    log: list[dict[str, Any]] = []
    rc, result = outcome(proc, cfg, log)
    assert (rc, result["reason"], result["hypervisorExitStatus"]) == (1, "StopTimeoutKilled", 137), result
    # SendCtrlAltDel once a second (never at or after the deadline: the kill comes then), numbered from 1
    attempts = [x["attempt"] for x in log if x["msg"] == "graceful stop sent"]
    assert 2 <= len(attempts) <= 5 and attempts == list(range(1, len(attempts) + 1)), log
    assert (tmp_path / "serial.log").read_text().count("fake console: action SendCtrlAltDel") == len(attempts)


@pytest.mark.parametrize(("mode", "reason", "rc"), [("reboot", "GuestReboot", 0), ("crash", "HypervisorCrashed", 1)])
def test_unasked_exit_status_maps_to_a_reason(tmp_path: Path, mode: str, reason: str, rc: int) -> None:
    proc, cfg = setup(tmp_path, mode)
    got_rc, result = outcome(proc, cfg)
    assert (got_rc, result["reason"]) == (rc, reason), result
    if mode == "crash":
        assert "bad syscall" in result["message"] and result["hypervisorExitStatus"] == 148


RUN_AS = 1610612999


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].split()[0]
    raise AssertionError(f"{name} not in /proc/{pid}/status")


def test_jailer_runs_the_vmm_as_run_as_in_a_prepared_jail_and_everything_is_undone(tmp_path: Path) -> None:
    require("guest", os.geteuid() == 0, "the jailer's privilege drop needs root")
    proc, cfg = setup(tmp_path, "obey", jailed=True)
    base = Path(cfg["hypervisor"]["jailer"]["chrootBaseDir"])
    try:
        jailed_run_and_cleanup(tmp_path, proc, cfg, base / "firecracker" / "default-alice")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def jailed_run_and_cleanup(tmp_path: Path, proc: subprocess.Popen[bytes], cfg: dict[str, Any], jail: Path) -> None:
    wait_for(jail / "root" / "run" / "firecracker.socket", proc)
    disk = Path(cfg["rootDisk"]["path"])
    assert (disk.stat().st_uid, disk.stat().st_gid) == (RUN_AS, RUN_AS), "root disk chowned for the run"
    written = json.loads((jail / "root" / "firecracker.json").read_text())
    assert written["drives"][0]["path_on_host"] == "/rootfs.raw"
    assert (jail / "root" / "rootfs.raw").stat().st_ino == disk.stat().st_ino, "hard link, not a copy"
    vmm = int((tmp_path / "run" / "vmm.pid").read_text())
    assert status_field(vmm, "Uid") == str(RUN_AS) and status_field(vmm, "Gid") == str(RUN_AS)
    proc.send_signal(signal.SIGTERM)  # SendCtrlAltDel through the jail's API socket
    rc, result = outcome(proc, cfg)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    assert not jail.exists(), "jail removed"
    assert (disk.stat().st_uid, disk.stat().st_gid) == (0, 0), "root disk owner restored"
    assert "fake console: reset" in (tmp_path / "serial.log").read_text()


def test_killed_launcher_takes_its_jailed_vmm_along(tmp_path: Path) -> None:
    """A VMM that changed uid lost PR_SET_PDEATHSIG; the launcher's watchdog kills it instead."""
    require("guest", os.geteuid() == 0, "the jailer's privilege drop needs root")
    proc, cfg = setup(tmp_path, "ignore", jailed=True)
    base = Path(cfg["hypervisor"]["jailer"]["chrootBaseDir"])
    try:
        kill_launcher_and_wait_for_the_vmm(tmp_path, proc, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def kill_launcher_and_wait_for_the_vmm(tmp_path: Path, proc: subprocess.Popen[bytes], base: Path) -> None:
    wait_for(base / "firecracker" / "default-alice" / "root" / "run" / "firecracker.socket", proc)
    vmm = int((tmp_path / "run" / "vmm.pid").read_text())
    assert status_field(vmm, "Uid") == str(RUN_AS)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{vmm}").exists() and status_field(vmm, "State") != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{vmm}").exists() or status_field(vmm, "State") == "Z", "the jailed VMM outlived it"
