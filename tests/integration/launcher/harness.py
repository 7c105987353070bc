"""Run the real launcher (``python -m zjusct_launcher run``) as a subprocess and observe what it leaves behind."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
LAUNCHER_DIR = REPO / "launcher"
PYTHON = sys.executable


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago and that this process has not handed out before.

    Tests take several ports before any QEMU binds one (the fleet of test_launcher_qemu takes 11); the kernel
    picks each ephemeral port at random, so two calls return the same port about once in 280 such batches.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


# How long a launcher waits for a guest to power off after a stop request before it kills the VMM. A busybox guest
# powers off in about a second on a quiet machine but took over 30 s under the suite's load (load 6 on 2 cores: a
# boot-slot test ended StopTimeoutKilled at the old 30 s), so tests that assert a graceful stop get a deadline sized
# for that load; a test about the kill sets its own short one.
GUEST_STOP_TIMEOUT = 180


def base_config(workdir: Path, name: str, *, kernel: str, initrd: str, disk: str, cmdline: str,
                port: int | None = None, boot_id: int = 1, memory_mib: int = 256) -> dict[str, Any]:
    """A valid LauncherConfig v1 for user-mode networking (or mode none when port is None)."""
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"zjusct-test/{name}"))
    cfg: dict[str, Any] = {
        "apiVersion": "launcher.cloud.zjusct.io/v1", "kind": "LauncherConfig",
        "vm": {"namespace": "test", "name": name, "uid": uid, "bootID": boot_id},
        "machine": {"vcpus": 1, "memoryMiB": memory_mib},
        "boot": {"kernel": kernel, "initrd": initrd, "cmdline": cmdline},
        "rootDisk": {"path": disk, "cache": "Writeback"},
        "identity": {"hostname": name, "instanceID": uid,
                     "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly test@zjusct"]},
        "network": {"mode": "none"} if port is None else {"mode": "user", "hostForwardPort": port},
        "hypervisor": {"type": "qemu", "accel": "tcg", "tcgTranslationCacheMiB": 32},
        "readiness": None if port is None else {"timeoutSeconds": 400},
        "stopTimeoutSeconds": GUEST_STOP_TIMEOUT,
        "runtimeDir": str(workdir / "run"),
        "serialLogPath": str(workdir / "serial.log"),
        "result": {"path": str(workdir / f"result-{boot_id}.json")},
    }
    return cfg


class Launched:
    """One launcher process for one config."""

    def __init__(self, cfg: dict[str, Any], workdir: Path, netns: str | None = None, tag: str = ""):
        self.cfg = copy.deepcopy(cfg)
        self.workdir = workdir
        self.config_path = workdir / f"config{tag}-{cfg['vm']['bootID']}.json"
        self.config_path.write_text(json.dumps(self.cfg, indent=2))
        self.stderr_path = workdir / f"launcher{tag}-{cfg['vm']['bootID']}.log"
        argv = [PYTHON, "-m", "zjusct_launcher", "run", "--config", str(self.config_path)]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        env = dict(os.environ, PYTHONPATH=str(LAUNCHER_DIR))
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, env=env)

    @property
    def runtime_dir(self) -> Path:
        return Path(self.cfg["runtimeDir"])

    @property
    def result_path(self) -> Path:
        return Path(self.cfg["result"]["path"])

    @property
    def ready_path(self) -> Path:
        return Path(self.cfg.get("readyMarkerPath") or (self.runtime_dir / "ready"))

    def vmm_pid(self) -> int:
        return int((self.runtime_dir / "vmm.pid").read_text())

    def wait_ready(self, timeout: float = 400) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_path.exists():
                return json.loads(self.ready_path.read_text())
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode} before ready:\n{self.log_tail()}")
            time.sleep(0.5)
        raise AssertionError(f"not ready within {timeout} s:\n{self.log_tail()}\nserial:\n{self.serial_tail()}")

    def wait(self, timeout: float = 300) -> tuple[int, dict[str, Any] | None]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launcher still running after {timeout} s:\n{self.log_tail()}") from None
        finally:
            self._stderr.close()
        result = json.loads(self.result_path.read_text()) if self.result_path.exists() else None
        return rc, result

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"raw": line})
        return out

    def log_tail(self, n: int = 15) -> str:
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-n:])

    def serial_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(Path(self.cfg["serialLogPath"]).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no serial log)"

    def kill(self) -> None:
        """Teardown: kill the launcher (its VMM dies with it through PR_SET_PDEATHSIG) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if not self._stderr.closed:
            self._stderr.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_dead(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    return False


def leftovers(runtime_dir: Path) -> list[str]:
    """Files left in runtimeDir besides the lock file (which is kept by design)."""
    if not runtime_dir.exists():
        return []
    return sorted(p.name for p in runtime_dir.iterdir() if p.name != "launcher.lock")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (iproute2), capturing its output."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@contextlib.contextmanager
def bridged_netns(name: str, gateway_cidr: str) -> Iterator[str]:
    """A network namespace ``name`` with lo up and a bridge ``zjbr0`` holding ``gateway_cidr``; deleted on exit."""
    ip("netns", "add", name)
    try:
        for args in (["link", "set", "lo", "up"], ["link", "add", "zjbr0", "type", "bridge"],
                     ["addr", "add", gateway_cidr, "dev", "zjbr0"], ["link", "set", "zjbr0", "up"]):
            ip("-n", name, *args)
        yield name
    finally:
        ip("netns", "del", name, check=False)
