"""A throwaway single-host cloud for the Molecule scenario ``hypervisor`` (docs/testing.md#molecule).

    python extensions/molecule/hypervisor/throwaway_cloud.py up DIR     # create.yml
    python extensions/molecule/hypervisor/throwaway_cloud.py down DIR   # destroy.yml

Run from the repository root or with it on ``PYTHONPATH`` (the pid helpers are tests/cluster's).

``up`` builds, under ``DIR``, the private host cloud the scenario's guest runs in, the way tests/e2e/host/conftest.py
builds one for the end-to-end tests: a host configuration ``DIR/host.json`` (store, volumes, state and logs under
``DIR``, runtime directory ``/run/zjc-mh-<tag>``, the cached guest image set of ``$ZJUSCT_CACHE/images``, the
launcher of this checkout, the test suite's boot slots of tests/conftest.py), a network namespace of its own for
the guests' bridge (``zjc-mh-<tag>``), and two more namespaces standing in for the host and the world behind the
uplink (``zjc-mho-<tag>``, which forwards, and ``zjc-mhw-<tag>``, holding 198.51.100.1), so nothing in the host's
own namespace changes (its ``net.ipv4.ip_forward`` stays as it is: guests of a cloud whose uplink ends in the host's
namespace reach the Debian mirror only once the operator enables it, docs/network.md). The tag is random: the names
never collide with the end-to-end tests' (``zjc-e2e-*``) nor with another run.

The guest gets its Debian packages from a real package cache: Debian's apt-cacher-ng, run in the host's namespace
(so it reaches the mirror) with its configuration, cache and logs under ``DIR/acng``, listening on 127.0.0.1 only
(a random port below 32768: apt-cacher-ng 3.7 cannot bind a higher one). Two socat relays carry a guest's
connections to it without any address in the host's namespace facing the guests: one in the world namespace
listens on 198.51.100.1:3142 and connects to the Unix socket ``DIR/relay.sock`` (a path, so it crosses
namespaces), the other, in the host's namespace, listens there and connects to apt-cacher-ng. A guest's apt uses
``http://198.51.100.1:3142`` as its proxy (converge.yml); the connection goes through the cloud's NAT and uplink
like any guest traffic.

``up`` also makes the SSH key ``DIR/id_ed25519`` the guest is booted with, records the names in
``DIR/throwaway.json`` and the three daemons' pids in ``DIR/daemons.json``, and waits until apt-cacher-ng answers
through the relays. Prints ``started`` (or ``running`` when ``DIR`` already holds a cloud whose daemons answer).

``down`` kills every process whose command line names ``DIR`` (the three daemons, and any launcher or QEMU the
scenario's destroy step did not stop: SIGTERM, SIGKILL after 15 s), deletes the three namespaces (with them the
bridge, the guests' TAP devices and the uplink veth, all inside them), removes the runtime directory and ``DIR``. Prints
``removed`` or ``absent``.

Exit status 1 with the reason on stderr: apt-cacher-ng, socat or the guest image set is missing, or the relay did
not answer within 60 s (the daemons are stopped again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster._cluster import pid_alive, tail
from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
REPO = Path(__file__).resolve().parents[3]
PROXY_ADDRESS = "198.51.100.1"
PROXY_PORT = 3142
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def names(tag: str) -> dict[str, str]:
    """The kernel-wide names of one throwaway cloud (namespaces, runtime directory)."""
    return {"netns": f"zjc-mh-{tag}", "outside": f"zjc-mho-{tag}", "world": f"zjc-mhw-{tag}",
            "runtime_dir": f"/run/zjc-mh-{tag}"}


def image_set() -> Path:
    """The complete default image set in the shared cache (what tests/guest_image_fixture.py builds)."""
    report = CACHE / "images" / ".guest_image.report.json"
    try:
        path = Path(json.loads(report.read_text())["path"])
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"no guest image set in {CACHE / 'images'} ({exc}): build it with "
                         "ansible-playbook playbooks/guest_image.yml (docs/guest-image.md)") from exc
    if not (path / "manifest.json").is_file():
        raise SystemExit(f"incomplete guest image set {path}")
    return path


def ip(*args: str) -> None:
    """Run ``ip ARGS``, failing loudly."""
    subprocess.run(["ip", *args], check=True)


def host_config(work: Path, tag: str, image: Path) -> dict:
    """The private cloud's host configuration (the keys of roles/hypervisor's host.json)."""
    n = names(tag)
    manifest = json.loads((image / "manifest.json").read_text())
    return {
        "node": "molecule-host",
        "store_path": str(work / "cloud.db"),
        "images_dir": str(image.parent),
        "default_image": manifest["name"],
        "volumes_dir": str(work / "volumes"),
        "state_dir": str(work / "state"),
        "runtime_dir": n["runtime_dir"],
        "log_dir": str(work / "log"),
        "netns": n["netns"],
        "bridge": "zjbr0",
        "subnet": "10.219.0.0/24",
        "nat": True,
        "uplink_cidr": "100.64.219.0/30",
        "uplink_netns": n["outside"],
        "uplink_ip_forward": True,
        "dns": [PROXY_ADDRESS],
        "launcher_command": [sys.executable, "-m", "zjusct_launcher"],
        "launcher_pythonpath": str(REPO / "launcher"),
        "stop_timeout_seconds": 90,
        # TCG on a loaded 2-core machine: as patient as tests/e2e/host/conftest.py
        "readiness_timeout_seconds": 1800,
        "tcg_translation_cache_mib": 256,
        "accel": os.environ.get("ZJUSCT_MOLECULE_ACCEL", "auto"),
        # make test runs this scenario next to pytest's lanes: the guest takes one of the machine's test boot
        # slots until it answers SSH, like every guest the tests boot (docs/testing.md, boot slots)
        "max_concurrent_boots": TEST_BOOT_SLOTS,
        "boot_slot_dir": TEST_BOOT_SLOT_DIR,
    }


def make_world(tag: str) -> None:
    """The uplink's outer namespace and the world behind it (198.51.100.1), as tests/e2e/host/conftest.py does."""
    n = names(tag)
    for ns in (n["outside"], n["world"]):
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", n["world"], "addr", "add", f"{PROXY_ADDRESS}/32", "dev", "lo")
    ip("-n", n["outside"], "link", "add", "zjw0", "type", "veth", "peer", "name", "eth0", "netns", n["world"])
    for ns, dev, address in ((n["outside"], "zjw0", "192.0.2.1/24"), (n["world"], "eth0", "192.0.2.2/24")):
        ip("-n", ns, "addr", "add", address, "dev", dev)
        ip("-n", ns, "link", "set", dev, "up")
    ip("-n", n["outside"], "route", "add", f"{PROXY_ADDRESS}/32", "via", "192.0.2.2")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 below 32768 (apt-cacher-ng 3.7 fails to bind a Port above 32767)."""
    for _attempt in range(100):
        port = secrets.randbelow(32767 - 20000) + 20000
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SystemExit("no free TCP port on 127.0.0.1 in 20000-32767")


def acng_conf(acng: Path, port: int) -> str:
    """apt-cacher-ng's configuration: a plain caching proxy on 127.0.0.1:``port``, every path under ``acng``."""
    return (f"CacheDir: {acng / 'cache'}\nLogDir: {acng / 'log'}\nSupportDir: /usr/lib/apt-cacher-ng\n"
            f"Port: {port}\nBindAddress: 127.0.0.1\nSocketPath: {acng / 'acng.sock'}\nForeGround: 1\n"
            "ReportPage: acng-report.html\n")


def spawn(argv: list[str], log: Path) -> int:
    """Start a daemon in a session of its own (it outlives this command); its output goes to ``log``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid


def relay_answers(world: str) -> bool:
    """True when an HTTP request to the relay in the world namespace gets apt-cacher-ng's answer."""
    probe = subprocess.run(
        ["ip", "netns", "exec", world, sys.executable, "-c",
         "import socket,sys\n"
         f"s=socket.create_connection(('{PROXY_ADDRESS}',{PROXY_PORT}),5)\n"
         "s.sendall(b'GET /acng-report.html HTTP/1.0\\r\\n\\r\\n')\n"
         "sys.stdout.write(s.recv(64).decode(errors='replace'))"],
        capture_output=True, text=True, timeout=20, check=False)
    return probe.returncode == 0 and probe.stdout.startswith("HTTP/")


def up(work: Path) -> str:
    """Build the throwaway cloud under ``work``; see the module docstring."""
    record = work / "throwaway.json"
    if record.exists():
        tag = json.loads(record.read_text())["tag"]
        pids = json.loads((work / "daemons.json").read_text()) if (work / "daemons.json").exists() else {}
        if len(pids) == 3 and all(pid_alive(p) for p in pids.values()) and relay_answers(
                names(tag)["world"]):
            return "running"
        raise SystemExit(f"{work} holds a broken throwaway cloud: run down first")
    for tool in ("apt-cacher-ng", "socat", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (hack/install-deps.sh installs it)")
    image = image_set()
    tag = secrets.token_hex(3)
    work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"tag": tag, **names(tag)}) + "\n")
    config = host_config(work, tag, image)
    (work / "host.json").write_text(json.dumps(config, indent=2) + "\n")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "molecule-hypervisor", "-f", str(key)],
                   check=True)
    make_world(tag)
    acng = work / "acng"
    for sub in ("cache", "log"):
        (acng / sub).mkdir(parents=True, exist_ok=True)
    port = free_port()
    (acng / "acng.conf").write_text(acng_conf(acng, port))
    # in the foreground, so the recorded pid is the daemon's
    pids = {"acng": spawn(["apt-cacher-ng", "-c", str(acng)], acng / "daemon.log")}
    sock = work / "relay.sock"
    pids["socat-host"] = spawn(["socat", f"UNIX-LISTEN:{sock},fork", f"TCP:127.0.0.1:{port}"],
                               work / "socat-host.log")
    # ip netns exec execs socat: the pid is socat's
    pids["socat-world"] = spawn(["ip", "netns", "exec", names(tag)["world"], "socat",
                                 f"TCP-LISTEN:{PROXY_PORT},bind={PROXY_ADDRESS},reuseaddr,fork",
                                 f"UNIX-CONNECT:{sock}"], work / "socat-world.log")
    (work / "daemons.json").write_text(json.dumps(pids) + "\n")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if sock.exists() and relay_answers(names(tag)["world"]):
            return "started"
        time.sleep(1)
    files = (acng / "daemon.log", acng / "log" / "apt-cacher.err", work / "socat-host.log", work / "socat-world.log")
    logs = "\n".join(tail(p) for p in files)
    down(work)
    raise SystemExit(f"the package relay did not answer within {START_TIMEOUT:.0f} s:\n{logs}")


def ancestors() -> set[int]:
    """This process and its ancestors (their command lines name ``DIR`` too)."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def processes_naming(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``, this command and its ancestors excluded."""
    skip, found = ancestors(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry))
    return found


def down(work: Path) -> str:
    """Tear the throwaway cloud under ``work`` down; see the module docstring."""
    if not work.exists():
        return "absent"
    marker = f"{work}/"
    pids = processes_naming(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(pid_alive(p) for p in processes_naming(marker)):
        time.sleep(0.2)
    for pid in processes_naming(marker):
        print(f"SIGKILL {pid}", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    record = work / "throwaway.json"
    if record.exists():
        n = json.loads(record.read_text())
        for ns in (n["netns"], n["outside"], n["world"]):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(n["runtime_dir"], ignore_errors=True)
    shutil.rmtree(work)
    return "removed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    work = args.dir.resolve()
    print(up(work) if args.action == "up" else down(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
