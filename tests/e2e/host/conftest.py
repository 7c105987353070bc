"""Fixtures for the single-host backend's end-to-end tests: a private host config, real playbooks.

Every test here drives the product the way an operator does — ``ansible-playbook playbooks/...``
from the repository root — against real QEMU guests on a bridge inside a network namespace that
the fixture creates and removes. The host configuration points at temporary state, volume, runtime
and log directories and at the cached guest image, so nothing under /var/lib or /etc is touched.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
# what ssh prints (exit 255) when it could not log in, so the remote command never ran
SSH_LOGIN_FAILED = re.compile(r"Connection (refused|closed|reset|timed out)|kex_exchange_identification|"
                              r"banner exchange|Permission denied \(publickey")


@dataclass
class Cloud:
    """A private single-host cloud: its host config path and directories."""

    config_path: Path
    config: dict
    root: Path
    key: Path
    world_netns: str = ""  # beyond the uplink's outer side: holds 198.51.100.1

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(ZJUSCT_CLOUD_CONFIG=str(self.config_path), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                   PATH=f"{VENV_BIN}:{env.get('PATH', '')}", ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
        return env

    def playbook(self, name: str, *extra: str, check: bool = True, timeout: int = 1200,
                 options: tuple = ()) -> dict:
        """Run ``playbooks/<name>.yml`` with ``-e`` pairs (and ``options`` such as ``--check``).

        Returns the json callback's document plus ``rc`` and ``stderr``.
        """
        argv = [str(VENV_BIN / "ansible-playbook"), f"playbooks/{name}.yml", *options,
                "-e", f"ssh_public_key_file={self.key}.pub"]
        for pair in extra:
            argv += ["-e", pair]
        proc = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout,
                              check=False)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            doc = {"raw": proc.stdout}
        doc["rc"] = proc.returncode
        doc["stderr"] = proc.stderr
        if check:
            assert proc.returncode == 0, failure(name, doc)
        return doc

    def vm(self, name: str) -> dict:
        """The CloudVM as cloudvm_info returns it (status re-derived from what runs)."""
        argv = [str(VENV_BIN / "ansible"), "localhost", "-m", "zjusct.cloud.cloudvm_info", "-a", f"name={name}"]
        proc = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120,
                              check=True)
        doc = json.loads(proc.stdout)
        items = doc["plays"][0]["tasks"][0]["hosts"]["localhost"]["cloudvms"]
        return items[0] if items else {}

    def ssh(self, ip: str, command: str, timeout: int = 60, stdin: str = "") -> subprocess.CompletedProcess:
        """Run ``command`` in a guest over SSH from inside the cloud's network namespace (``stdin`` fed to it).

        A login that ssh itself could not make (exit 255 with ssh's own connection or authentication message, so
        the command never ran) is tried again, up to 3 times 5 s apart: a VM is Running once its sshd sends the
        banner, and under heavy load that comes slightly before it accepts logins.
        """
        argv = ["ip", "netns", "exec", self.config["netns"], "ssh", "-i", str(self.key), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
                f"root@{ip}", command]
        for _ in range(3):
            proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
            if proc.returncode != 255 or not SSH_LOGIN_FAILED.search(proc.stderr):
                return proc
            time.sleep(5)
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)


def listening(netns: str, port: int) -> bool:
    """True when a TCP socket listens on ``port`` in network namespace ``netns``."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                         text=True, check=False).stdout
    return bool(out.strip())


def wait_listening(server: subprocess.Popen, netns: str, port: int, timeout: float = 30.0) -> None:
    """Wait until ``server`` listens on ``port`` in ``netns``; fail if it exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not listening(netns, port):
        assert server.poll() is None, f"the server for port {port} exited with {server.returncode}"
        assert time.monotonic() < deadline, f"nothing listens on port {port} in {netns} after {timeout} s"
        time.sleep(0.1)


def console_session(world: str, ssh_config: Path, *args: str) -> subprocess.Popen:
    """``ssh -F <ssh_config> -tt <args>`` (e.g. ``-p 2222 zc-alice@<gateway> console alice``) from the ``world``
    namespace (outside the host), stdin and stdout (with stderr) pipes: a serial console session to drive with
    :func:`type_until`."""
    return subprocess.Popen(["ip", "netns", "exec", world, "ssh", "-F", str(ssh_config), "-tt", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def type_until(session: subprocess.Popen, keys: bytes, marker: bytes, timeout: float = 300) -> bytes:
    """Send ``keys`` on a :func:`console_session`, then read until ``marker`` (AssertionError with what came, after
    ``timeout`` or when the session ends first)."""
    assert session.stdin is not None and session.stdout is not None
    session.stdin.write(keys)
    session.stdin.flush()
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; saw {seen[-2000:]!r}"
        if select.select([session.stdout], [], [], min(left, 5))[0]:
            chunk = os.read(session.stdout.fileno(), 65536)
            assert chunk, f"the session ended before {marker!r}; saw {seen[-2000:]!r}"
            seen += chunk
    return seen


def failure(name: str, doc: dict) -> str:
    """What a failed playbook run printed, for an assertion message: the exit code and stderr's last line first
    (pytest's summary shows only an assertion's first line), then stdout's and stderr's tails."""
    stderr = doc.get("stderr", "")
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    stdout = doc.get("raw") or json.dumps(doc.get("plays", ""))
    return f"{name} exit {doc.get('rc')}, stderr: {last[-300:]}\n{stdout[-4000:]}\n{stderr[-2000:]}"


def launcher_pids(cloud: Cloud, vm: str, namespace: str = "default") -> list[int]:
    """Pids of launcher processes (not their VMMs) of one VM, found by their config path.

    A process the launcher forks shows the launcher's command line until it calls exec (for the VMM: while
    subprocess runs ``preexec_fn`` in it, which takes a while on a loaded machine); its parent is a launcher,
    so it is not counted: only processes whose parent is not a launcher of the VM are.
    """
    marker = f"{cloud.config['state_dir']}/vms/{namespace}_{vm}/boot-"
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if "zjusct_launcher" in " ".join(args) and any(a.startswith(marker) for a in args):
            parents[int(entry)] = ppid
    return sorted(pid for pid, ppid in parents.items() if ppid not in parents)


@pytest.fixture(scope="module")
def cloud(guest_image, tmp_path_factory) -> Cloud:
    """A private host config with its own netns and subnet; everything torn down afterwards."""
    root = tmp_path_factory.mktemp("cloud")
    tag = uuid.uuid4().hex[:6]
    netns = f"zjc-e2e-{tag}"
    # The uplink's outer end goes into a namespace of the test's own standing in for the host
    # (``outside``, forwarding by the operator's opt-in uplink_ip_forward), which routes to "the world"
    # (``world``, one address: 198.51.100.1) over 192.0.2.0/24; so NAT is tested without touching the
    # host's namespace.
    outside, world = f"zjc-out-{tag}", f"zjc-wld-{tag}"
    for ns in (outside, world):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-n", world, "addr", "add", "198.51.100.1/32", "dev", "lo"], check=True)
    subprocess.run(["ip", "-n", outside, "link", "add", "zjw0", "type", "veth", "peer", "name", "eth0", "netns",
                    world], check=True)
    for ns, dev, address in ((outside, "zjw0", "192.0.2.1/24"), (world, "eth0", "192.0.2.2/24")):
        subprocess.run(["ip", "-n", ns, "addr", "add", address, "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
    subprocess.run(["ip", "-n", outside, "route", "add", "198.51.100.1/32", "via", "192.0.2.2"], check=True)
    config = {
        "node": "e2e-host",
        "store_path": str(root / "cloud.db"),
        "images_dir": str(Path(guest_image.dir).parent),
        "default_image": guest_image.manifest["name"],
        "volumes_dir": str(root / "volumes"),
        "state_dir": str(root / "state"),
        "runtime_dir": f"/run/zjc-e2e-{tag}",
        "log_dir": str(root / "log"),
        "netns": netns,
        "bridge": "zjbr0",
        "subnet": "10.213.0.0/24",
        "nat": True,
        "uplink_cidr": "100.64.213.0/30",
        "uplink_netns": outside,
        "uplink_ip_forward": True,
        "dns": ["198.51.100.1"],
        "launcher_command": [sys.executable, "-m", "zjusct_launcher"],
        "launcher_pythonpath": str(REPO / "launcher"),
        "stop_timeout_seconds": 90,
        # TCG guests on a shared, loaded test host (load 25+ on 2 cores seen) take more than 10 minutes to answer
        "readiness_timeout_seconds": 1800,
        "tcg_translation_cache_mib": 128,
        "max_concurrent_boots": TEST_BOOT_SLOTS,
        "boot_slot_dir": TEST_BOOT_SLOT_DIR,
        # auto exercises the launcher's KVM probe (on the CI machines KVM runs real mode only: the probe's kernel
        # stage falls back to TCG); ZJUSCT_E2E_ACCEL=tcg skips the probe
        "accel": os.environ.get("ZJUSCT_E2E_ACCEL", "auto"),
    }
    config_path = root / "host.json"
    config_path.write_text(json.dumps(config))
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cloud = Cloud(config_path, config, root, key, world)
    try:
        yield cloud
    finally:
        for vm_dir in (Path(config["state_dir"]) / "vms").glob("*"):
            for pid in launcher_pids(cloud, vm_dir.name.split("_", 1)[1], vm_dir.name.split("_", 1)[0]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in (netns, outside, world):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(config["runtime_dir"], ignore_errors=True)
        logs = root / "log"
        if logs.exists():
            for log in logs.glob("*.log"):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}")
