"""A throwaway Debian host for the Molecule scenario ``hypervisor`` (docs/testing.md#molecule).

    python extensions/molecule/hypervisor/throwaway_host.py up DIR     # create.yml
    python extensions/molecule/hypervisor/throwaway_host.py down DIR   # destroy.yml

Run from the repository root or with it on ``PYTHONPATH`` (the pid helpers are tests/cluster's).

``up`` makes, under ``DIR``, the Debian machine converge turns into a hypervisor: a system container
(``systemd-nspawn --boot``: systemd as its PID 1, its own PID, mount, IPC and UTS namespaces) whose root file system
is a private copy of the cached guest image's ``rootfs.raw`` (``DIR/root.raw``, loop-mounted on ``DIR/root``), so the
role meets what it meets on a freshly installed Debian host: apt and dpkg, systemd, ``/dev/net/tun``, and a network
namespace of its own in which it creates its own namespace, bridge, veth pair, nftables tables and sysctls. Nothing
of the machine's own network changes. A container and not a guest: under QEMU/TCG every dpkg unpack and every
module's Python start was emulated (the scenario took 6 min alone and 38 min beside the lanes of ``make test``),
and the role neither loads kernel modules nor boots guests there (``hypervisor_accel: tcg``, no image build).

The container's network namespace ``zjc-mhh-<tag>`` has ``eth0`` (192.0.2.2/24, default route via 192.0.2.1), a
veth whose peer is in a second namespace standing in for the world (``zjc-mhw-<tag>``: 192.0.2.1 and 198.51.100.1);
its ``net.ipv4.ip_forward`` is set to 0 (a fresh host's value; a new namespace inherits the machine's). The tag is
random: the names never collide with the end-to-end tests' (``zjc-e2e-*``) nor with another run.

Packages come from a real package cache: Debian's apt-cacher-ng, run in the machine's namespace (so it reaches the
mirror) with its configuration, cache and logs under ``DIR/acng``, listening on 127.0.0.1 only (a random port below
32768: apt-cacher-ng 3.7 cannot bind a higher one). Two socat relays carry the container's connections to it: one
in the world namespace listens on 198.51.100.1:3142 and connects to the Unix socket ``DIR/relay.sock`` (a path, so
it crosses namespaces), the other, in the machine's namespace, listens there and connects to apt-cacher-ng. The
container's apt uses ``http://198.51.100.1:3142`` as its proxy (converge.yml); beyond the world namespace nothing
answers, so that proxy is its only way to a mirror.

Before the boot ``up`` writes the SSH key ``DIR/id_ed25519``'s public half to the copy's
``/root/.ssh/authorized_keys`` (the image's ``zjusct-identity`` unit finds no config disk in a container and only
makes the host keys), then waits until the container's sshd answers, and writes the scenario's second inventory
source ``DIR/host-inventory.yml`` (host ``hv-host`` in group ``hypervisors``: root over SSH to 192.0.2.2 through
``ip netns exec <namespace> socat``; literal values, as testinfra's inventory reader does not template). The names
are in ``DIR/throwaway.json``, the daemons' pids (apt-cacher-ng, the relays, systemd-nspawn) in ``DIR/daemons.json``.
Prints ``started`` (or ``running`` when ``DIR`` already holds a host whose daemons are alive).

``down`` kills every process whose command line names ``DIR`` (systemd-nspawn first, which powers the container off
on SIGTERM, then the relays and the cache: SIGTERM, SIGKILL after 30 s), unmounts ``DIR/root`` (the loop device
goes with it), deletes both namespaces and removes ``DIR``. Prints ``removed`` or ``absent``.

Exit status 1 with the reason on stderr: systemd-nspawn, apt-cacher-ng, socat or the guest image set is missing,
or the relay or the container's sshd did not answer in time (everything made so far is removed again).
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
from collections.abc import Callable
from pathlib import Path

from tests.cluster._cluster import pid_alive, tail

CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
PROXY_ADDRESS = "198.51.100.1"
PROXY_PORT = 3142
HOST_ADDRESS, WORLD_ADDRESS = "192.0.2.2", "192.0.2.1"
HOST_NAME, GROUP = "hv-host", "hypervisors"
START_TIMEOUT = 60.0
SSH_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0
TOOLS = ("systemd-nspawn", "apt-cacher-ng", "socat", "ssh-keygen")


def names(tag: str) -> dict[str, str]:
    """The kernel-wide names of one throwaway host (its network namespace and the world's)."""
    return {"netns": f"zjc-mhh-{tag}", "world": f"zjc-mhw-{tag}"}


def image_set() -> Path:
    """The complete default image set in the shared cache (what tests/guest_image_fixture.py builds).

    Raises:
        SystemExit: no set, or one without its manifest.
    """
    report = CACHE / "images" / ".guest_image.report.json"
    try:
        path = Path(json.loads(report.read_text())["path"])
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"no guest image set in {CACHE / 'images'} ({exc}): build it with "
                         "ansible-playbook playbooks/guest_image.yml (docs/guest-image.md)") from exc
    if not (path / "manifest.json").is_file() or not (path / "rootfs.raw").is_file():
        raise SystemExit(f"incomplete guest image set {path}")
    return path


def ip(*args: str) -> None:
    """Run ``ip ARGS``, failing loudly."""
    subprocess.run(["ip", *args], check=True)


def leader(nspawn: int, timeout: float = START_TIMEOUT) -> int:
    """The pid of the container's PID 1 (``nspawn``'s child in a network namespace other than this process's).

    Raises:
        SystemExit: none within ``timeout`` s, or systemd-nspawn ended.
    """
    own = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(nspawn):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _ppid(int(entry)) == nspawn:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/net") != own:
                        return int(entry)
        time.sleep(0.1)
    raise SystemExit(f"systemd-nspawn (pid {nspawn}) started no container within {timeout:.0f} s")


def make_network(tag: str, pid: int) -> None:
    """Name the network namespace of the container's PID 1 ``pid``; give it ``eth0`` and the world behind it
    (192.0.2.1 and 198.51.100.1)."""
    n = names(tag)
    ip("netns", "attach", n["netns"], str(pid))
    ip("netns", "add", n["world"])
    for ns in (n["netns"], n["world"]):
        ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", n["world"], "addr", "add", f"{PROXY_ADDRESS}/32", "dev", "lo")
    ip("-n", n["world"], "link", "add", "zjw0", "type", "veth", "peer", "name", "eth0", "netns", n["netns"])
    for ns, dev, address in ((n["world"], "zjw0", f"{WORLD_ADDRESS}/24"), (n["netns"], "eth0", f"{HOST_ADDRESS}/24")):
        ip("-n", ns, "addr", "add", address, "dev", dev)
        ip("-n", ns, "link", "set", dev, "up")
    ip("-n", n["netns"], "route", "add", "default", "via", WORLD_ADDRESS)
    subprocess.run(["ip", "netns", "exec", n["netns"], "sysctl", "-q", "-w", "net.ipv4.ip_forward=0"], check=True)


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


def answers(netns: str, address: str, port: int, request: bytes, prefix: str) -> bool:
    """True when a TCP connection from ``netns`` to ``address:port`` (``request`` sent first, if any) gets an answer
    starting with ``prefix``."""
    probe = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c",
         "import socket,sys\n"
         f"s=socket.create_connection(('{address}',{port}),5)\n"
         f"s.sendall({request!r})\n"
         "sys.stdout.write(s.recv(64).decode(errors='replace'))"],
        capture_output=True, text=True, timeout=20, check=False)
    return probe.returncode == 0 and probe.stdout.startswith(prefix)


def relay_answers(netns: str) -> bool:
    """True when an HTTP request to the relay, sent from ``netns``, gets apt-cacher-ng's answer."""
    return answers(netns, PROXY_ADDRESS, PROXY_PORT, b"GET /acng-report.html HTTP/1.0\r\n\r\n", "HTTP/")


def wait(what: str, ready: Callable[[], bool], timeout: float, logs: list[Path]) -> None:
    """Poll ``ready()`` each second until it is true.

    Raises:
        SystemExit: not within ``timeout`` s (the message has the tails of ``logs``).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(1)
    text = "\n".join(tail(p) for p in logs)
    raise SystemExit(f"{what} did not answer within {timeout:.0f} s:\n{text}")


def inventory(tag: str, work: Path) -> dict:
    """The scenario's second inventory source: the container as ``hv-host``, root over SSH through its namespace."""
    proxy = f"ip netns exec {names(tag)['netns']} socat - TCP:%h:%p"
    return {GROUP: {"hosts": {HOST_NAME: {
        "ansible_host": HOST_ADDRESS, "ansible_port": 22, "ansible_user": "root",
        "ansible_ssh_private_key_file": str(work / "id_ed25519"),
        "ansible_ssh_common_args": f'-o ProxyCommand="{proxy}" -o StrictHostKeyChecking=no'
                                   " -o UserKnownHostsFile=/dev/null",
        "ansible_python_interpreter": "/usr/bin/python3"}}}}


def up(work: Path) -> str:
    """Build the throwaway host under ``work``; see the module docstring."""
    record = work / "throwaway.json"
    if record.exists():
        tag = json.loads(record.read_text())["tag"]
        pids = json.loads((work / "daemons.json").read_text()) if (work / "daemons.json").exists() else {}
        if len(pids) == 4 and all(pid_alive(p) for p in pids.values()) and answers(
                names(tag)["world"], HOST_ADDRESS, 22, b"", "SSH-"):
            return "running"
        raise SystemExit(f"{work} holds a broken throwaway host: run down first")
    for tool in TOOLS:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (hack/install-deps.sh installs it)")
    image = image_set()
    tag = secrets.token_hex(3)
    work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"tag": tag, **names(tag)}) + "\n")
    try:
        return _build(work, tag, image)
    except BaseException:
        down(work)  # nothing half-made is left behind
        raise


def _build(work: Path, tag: str, image: Path) -> str:
    """``up``'s work once ``work/throwaway.json`` names ``tag``."""
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "molecule-hypervisor", "-f", str(key)],
                   check=True)
    root_image, root = work / "root.raw", work / "root"
    subprocess.run(["cp", "--sparse=always", str(image / "rootfs.raw"), str(root_image)], check=True)
    root_image.chmod(0o600)
    root.mkdir()
    subprocess.run(["mount", "-o", "loop", str(root_image), str(root)], check=True)
    ssh_dir = root / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    n = names(tag)
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
    # --keep-unit and --register=no: no systemd or machined on the machine is needed (make test runs in containers
    # whose PID 1 is not systemd); --private-network: a network namespace of nspawn's, in which the container keeps
    # CAP_NET_ADMIN and a writable /proc/sys/net (the role's namespace, bridge, veth, nftables and sysctls), named
    # and wired by make_network once its PID 1 runs; the console is the log file
    pids["nspawn"] = spawn(["systemd-nspawn", "--quiet", "--keep-unit", "--register=no", f"--directory={root}",
                            f"--machine=zjc-mhh-{tag}", "--private-network", "--boot"], work / "container.log")
    make_network(tag, leader(pids["nspawn"]))
    # ip netns exec execs socat: the pid is socat's
    pids["socat-world"] = spawn(["ip", "netns", "exec", n["world"], "socat",
                                 f"TCP-LISTEN:{PROXY_PORT},bind={PROXY_ADDRESS},reuseaddr,fork",
                                 f"UNIX-CONNECT:{sock}"], work / "socat-world.log")
    (work / "daemons.json").write_text(json.dumps(pids) + "\n")
    wait("the package relay", lambda: sock.exists() and relay_answers(n["netns"]), START_TIMEOUT,
         [acng / "daemon.log", acng / "log" / "apt-cacher.err", work / "socat-host.log", work / "socat-world.log"])
    wait("the container's sshd", lambda: answers(n["world"], HOST_ADDRESS, 22, b"", "SSH-"), SSH_TIMEOUT,
         [work / "container.log"])
    (work / "host-inventory.yml").write_text(json.dumps(inventory(tag, work), indent=2) + "\n")
    return "started"


def ancestors() -> set[int]:
    """This process and its ancestors (their command lines name ``DIR`` too)."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        pid = _ppid(pid)
    return pids


def processes_naming(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``, this command and its ancestors excluded."""
    skip, found = ancestors(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        if marker in " ".join(_cmdline(int(entry))):
            found.append(int(entry))
    return found


def stop(pids: list[int]) -> None:
    """SIGTERM to ``pids``; SIGKILL to those still alive after STOP_TIMEOUT s."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in [p for p in pids if pid_alive(p)]:
        print(f"SIGKILL {pid}", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def down(work: Path) -> str:
    """Tear the throwaway host under ``work`` down; see the module docstring."""
    if not work.exists():
        return "absent"
    marker = f"{work}/"
    daemons = work / "daemons.json"
    nspawn = json.loads(daemons.read_text()).get("nspawn") if daemons.exists() else None
    if nspawn is not None and marker in " ".join(_cmdline(nspawn)):
        stop([nspawn])  # the container powers off before its package relay goes
    stop(processes_naming(marker))
    root = work / "root"
    if os.path.ismount(root):
        subprocess.run(["umount", str(root)], check=False, capture_output=True)
        if os.path.ismount(root):
            subprocess.run(["umount", "--lazy", str(root)], check=True)
    record = work / "throwaway.json"
    if record.exists():
        n = json.loads(record.read_text())
        for ns in (n["netns"], n["world"]):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    shutil.rmtree(work)
    return "removed"


def _cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` (empty when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _ppid(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


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
