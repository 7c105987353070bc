"""QMP client, SSH-banner readiness and the run lock, each against a real socket / real flock."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import kvm, lock, readiness
from zjusct_launcher.qmp import QmpClient, QmpError


def fake_qmp_server(path: str, script: list[bytes], answers: dict[str, bytes] | None = None,
                    seen: list[str] | None = None) -> threading.Thread:
    """Greets, answers qmp_capabilities, then for each later command sends ``script`` lines (events) then its answer:
    ``answers[command]`` (a JSON line) when given, an error for "bogus", else ``{"return": {}}``; appends each such
    command (with its arguments, as JSON) to ``seen``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.write(b'{"QMP": {"version": {}, "capabilities": []}}\r\n')
        f.flush()
        for line in f:
            req = json.loads(line)
            cmd = req["execute"]
            if cmd != "qmp_capabilities":
                for ev in script:
                    f.write(ev + b"\r\n")
                if seen is not None:
                    seen.append(json.dumps(req, sort_keys=True))
            if answers and cmd in answers:
                f.write(answers[cmd] + b"\r\n")
            elif cmd == "bogus":
                f.write(b'{"error": {"class": "CommandNotFound", "desc": "no bogus"}}\r\n')
            else:
                f.write(b'{"return": {}}\r\n')
            f.flush()
        conn.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_qmp_negotiates_and_keeps_events_seen_between_command_and_reply(tmp_path: Path) -> None:
    path = str(tmp_path / "qmp.sock")
    events = [b'{"event": "POWERDOWN", "data": {}}',
              b'{"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}']
    fake_qmp_server(path, events)
    client = QmpClient.connect(path, 5)
    assert client.execute("system_powerdown") == {}
    got = client.poll_events()
    assert [e["event"] for e in got] == ["POWERDOWN", "SHUTDOWN"]
    assert got[1]["data"]["reason"] == "guest-shutdown"
    with pytest.raises(QmpError, match="no bogus"):
        client.execute("bogus")
    client.close()


def test_qmp_connect_gives_up_when_the_vmm_is_gone(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(QmpError, match=r"the VMM exited|cannot connect"):
        QmpClient.connect(str(tmp_path / "none.sock"), 30, alive=lambda: time.monotonic() - start < 0.3)
    assert time.monotonic() - start < 10


def _server(reply: bytes | None) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if reply:
                conn.sendall(reply)
            time.sleep(0.3)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_readiness_needs_an_ssh_banner_not_just_a_connect() -> None:
    srv, port = _server(None)
    assert readiness.banner_once("127.0.0.1", port, banner_timeout=0.5) is None
    srv.close()
    srv, port = _server(b"HTTP/1.1 200 OK\r\n")
    assert readiness.banner_once("127.0.0.1", port, banner_timeout=0.5) is None
    srv.close()
    srv, port = _server(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n")
    assert readiness.banner_once("127.0.0.1", port).startswith(b"SSH-2.0-OpenSSH")
    srv.close()


def test_wait_for_banner_stops_on_request() -> None:
    stop = threading.Event()
    stop.set()
    assert readiness.wait_for_banner("127.0.0.1", 1, 60, stop) is None


def test_second_lock_holder_is_refused_and_lock_is_inherited_by_a_child(tmp_path: Path) -> None:
    path = str(tmp_path / "launcher.lock")
    fd = lock.acquire(path)
    assert lock.is_held(path)
    with pytest.raises(lock.AlreadyRunning):
        lock.acquire(path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=(fd,))
    os.close(fd)
    assert lock.is_held(path), "the child still holds the inherited lock"
    child.kill()
    child.wait()
    assert not lock.is_held(path)
    os.close(lock.acquire(path))


def test_probe_firmware_reset_vector() -> None:
    fw = kvm.probe_firmware()
    assert len(fw) == 65536 and fw[0xFFF0:0xFFF4] == bytes([0xB0, 0x31, 0xE6, 0xF4])


@pytest.mark.guest
def test_probe_firmware_really_runs_and_exits_through_debug_exit_under_tcg() -> None:
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None, "the guest gate (tests/conftest.py) checked qemu-system-x86_64"
    verdict = kvm.probe(qemu, 60, accel="tcg")
    assert verdict.usable, verdict.detail


@pytest.mark.guest
def test_kvm_probe_is_bounded_and_returns_a_verdict() -> None:
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None, "the guest gate (tests/conftest.py) checked qemu-system-x86_64"
    verdict = kvm.probe(qemu, 3)
    assert isinstance(verdict.usable, bool) and verdict.detail
    assert verdict.seconds < 3 + 5, "killed at the timeout"


def test_kvm_device_missing_is_unusable(tmp_path: Path) -> None:
    ok, detail = kvm.kvm_device_usable(str(tmp_path / "kvm"))
    assert not ok and "No such file" in detail


@pytest.mark.guest
def test_kvm_probe_with_kernel_boots_the_guest_kernel_to_its_first_message(guest_image: Any) -> None:
    """The kernel stage (see kvm.py: real mode alone runs on hosts where long mode never does) under TCG."""
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None
    verdict = kvm.probe(qemu, 120, accel="tcg", kernel=str(guest_image.vmlinuz))
    assert verdict.usable, verdict.detail
    assert "kernel vmlinuz runs under tcg" in verdict.detail


@pytest.mark.guest
def test_kvm_probe_with_a_kernel_that_never_prints_is_unusable_and_bounded(tmp_path: Path) -> None:
    """What a host with broken long mode looks like: the kernel stage runs and prints nothing."""
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu is not None
    silent = tmp_path / "vmlinuz"
    silent.write_bytes(b"\0" * 4096)  # QEMU loads it and the "kernel" runs nothing that prints
    verdict = kvm.probe(qemu, 3, accel="tcg", kernel=str(silent))
    assert not verdict.usable and "printed no 'Linux version' within 3 s under tcg" in verdict.detail, \
        verdict.detail
    not_a_kernel = tmp_path / "text"
    not_a_kernel.write_text("not a kernel\n")
    refused = kvm.probe(qemu, 60, accel="tcg", kernel=str(not_a_kernel))
    assert not refused.usable and "did not start under tcg: qemu: invalid kernel header" in refused.detail, \
        refused.detail


def test_a_qemu_boot_with_io_limits_fails_and_never_resumes_without_qmp(tmp_path: Path) -> None:
    """With rootDisk.ioLimits QEMU waits paused until the launcher has set them over QMP; no QMP connection, or
    QEMU refusing them, ends the boot (LauncherError) instead of running the guest unlimited."""
    from zjusct_launcher import config
    from zjusct_launcher.paths import RuntimePaths
    from zjusct_launcher.vmm import RunFailed
    from zjusct_launcher.vmm_qemu import QemuVmm

    doc = json.loads((Path(__file__).resolve().parents[3] / "launcher" / "examples" / "config-qemu-tap.json")
                     .read_text())
    doc["runtimeDir"] = str(tmp_path)
    doc["rootDisk"]["ioLimits"] = {"writeIOPS": 200}
    limited = QemuVmm(config.parse(doc), RuntimePaths(str(tmp_path)))
    start = time.monotonic()
    with pytest.raises(RunFailed) as err:
        limited.attach(alive=lambda: time.monotonic() - start < 0.3)
    assert err.value.reason == "LauncherError" and "rootDisk.ioLimits" in err.value.message
    fake_qmp_server(str(tmp_path / "qmp.sock"), [])  # answers every command; "bogus" alone is an error
    limited.attach(alive=lambda: True)  # set, then resumed
    assert limited.qmp is not None
    limited.cleanup()
    del doc["rootDisk"]["ioLimits"]
    (tmp_path / "qmp.sock").unlink()
    plain = QemuVmm(config.parse(doc), RuntimePaths(str(tmp_path)))
    start = time.monotonic()
    plain.attach(alive=lambda: time.monotonic() - start < 0.3)  # without limits: a warning, the boot goes on
    assert plain.qmp is None


def _root_size_vmm(tmp_path: Path, size_mib: int, io_limits: dict | None = None) -> Any:
    from zjusct_launcher import config
    from zjusct_launcher.paths import RuntimePaths
    from zjusct_launcher.vmm_qemu import QemuVmm

    doc = json.loads((Path(__file__).resolve().parents[3] / "launcher" / "examples" / "config-qemu-tap.json")
                     .read_text())
    doc["runtimeDir"] = str(tmp_path)
    doc["rootDisk"]["sizeMiB"] = size_mib
    if io_limits:
        doc["rootDisk"]["ioLimits"] = io_limits
    return QemuVmm(config.parse(doc), RuntimePaths(str(tmp_path)))


ROOT_4MIB = b'{"return": [{"device": "", "inserted": {"node-name": "root", "image": {"virtual-size": 4194304}}}]}'


def test_a_root_size_grows_a_smaller_disk_over_qmp_before_the_limits_and_the_resume(tmp_path: Path) -> None:
    """rootDisk.sizeMiB with QEMU paused: query-block, block_resize of the root node (only when smaller), then the
    limits, then cont; a refused resize ends the boot (LauncherError) and the guest is never resumed."""
    from zjusct_launcher.vmm import RunFailed

    seen: list[str] = []
    fake_qmp_server(str(tmp_path / "qmp.sock"), [], {"query-block": ROOT_4MIB}, seen)
    vmm = _root_size_vmm(tmp_path, 12, {"writeIOPS": 200})
    vmm.attach(alive=lambda: True)
    vmm.cleanup()
    assert [json.loads(c)["execute"] for c in seen] == ["query-block", "block_resize", "block_set_io_throttle",
                                                        "cont"]
    assert json.loads(seen[1])["arguments"] == {"node-name": "root", "size": 12 * 1048576}

    (tmp_path / "qmp.sock").unlink()
    seen.clear()
    fake_qmp_server(str(tmp_path / "qmp.sock"), [], {"query-block": ROOT_4MIB}, seen)
    vmm = _root_size_vmm(tmp_path, 4)  # already that size: no resize
    vmm.attach(alive=lambda: True)
    vmm.cleanup()
    assert [json.loads(c)["execute"] for c in seen] == ["query-block", "cont"]

    (tmp_path / "qmp.sock").unlink()
    seen.clear()
    fake_qmp_server(str(tmp_path / "qmp.sock"), [], {
        "query-block": ROOT_4MIB,
        "block_resize": b'{"error": {"class": "GenericError", "desc": "Cannot grow device files"}}'}, seen)
    vmm = _root_size_vmm(tmp_path, 12)
    with pytest.raises(RunFailed) as err:
        vmm.attach(alive=lambda: True)
    vmm.cleanup()
    assert err.value.reason == "LauncherError"
    assert err.value.message == ("rootDisk.sizeMiB: cannot grow the root disk to 12 MiB: block_resize: Cannot grow"
                                 " device files"), err.value.message
    assert "cont" not in [json.loads(c)["execute"] for c in seen]
