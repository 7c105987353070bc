#!/usr/bin/env python3
"""vm_start control-plane overhead of the host backend against a peer, libvirt, on the same guest, in the same run.

Both sides boot the same guest image set (its kernel, initrd and cmdline, a copy of its ``rootfs.raw``), with the
vCPUs, memory and TCG translation cache that our launcher gave QEMU in its first boot (read from its ``vmm
started`` log line), under QEMU/TCG:

A. ours: ``ansible-playbook playbooks/vm_start.yml`` on the stopped VM ``bench`` of a private host cloud
   (bench/host_backend.py's :func:`host_setup`: temp dirs, a netns of its own; nothing under /etc or /var/lib),
   which returns once the launcher saw the guest's SSH banner;
B. the peer: ``virsh start`` of an equivalent libvirt domain (domain type qemu, direct kernel boot, raw virtio
   disks with cache writeback, the same config disk built by the launcher's own code, user networking with a host
   port forward via ``<qemu:commandline>``), then this script waits for the SSH banner on the forwarded port with
   the launcher's own probe (zjusct_launcher.readiness.wait_for_banner, same 0.5 s attempt interval).

Per start: ``wall`` (A: the playbook; B: ``virsh start`` + the wait for the banner), ``guest`` = the guest's own
boot = banner seen minus the QEMU process's start (its ``/proc/<pid>/stat`` start time, CLOCK_BOOTTIME, 10 ms
ticks; A's banner time is the launcher's ``readyAt``, RFC 3339 with milliseconds; B's is this script's probe), and
``overhead`` = wall - guest: what each control plane adds around the same QEMU boot. A also shows the guest boot
as bench/host_backend.py defines it (launcher spawned -> readyAt, which counts the launcher's own start-up as
guest time) for continuity. Then the stop: ``vm_stop.yml`` vs ``virsh shutdown --mode acpi`` until the domain is
"shut off" (polled every 0.1 s), walls only.

Each side boots once before the pairs (not measured; ``--no-peer-warmup`` skips the peer's); ``--pairs`` pairs
alternate which side runs first. Prints each pair with the load average before and after and ours' phases (see
:data:`PHASES`), then two fixed costs timed alone (an empty ``ansible-playbook``, the launcher check subprocess),
the medians, the same-run ratio ours/peer of the overheads, and the verdicts against the goals (overhead
<= 3 s absolute; <= the peer's). ``--ansible-peer`` adds a third side to each round, rotating the order: the same
domain started by ``ansible-playbook`` (``virsh start`` through ``ansible.builtin.command``, then
``ansible.builtin.wait_for`` of the banner, 1 s between attempts); its overhead = wall - (the banner as this
script's own probe sees it - QEMU process start), so what the play does after the banner counts as overhead.

Prerequisite (as root): libvirt from Debian - ``apt-get install --no-install-recommends libvirt-daemon
libvirt-daemon-driver-qemu libvirt-clients`` (shared/recipes/peer-libvirt.md). When ``virsh`` is missing and the
script runs as root it installs them itself (saying so); it creates the user/group ``libvirt-qemu`` and the group
``kvm`` when missing, and starts ``virtlogd`` and ``libvirtd`` (foreground children, stopped by pid at the end)
unless a libvirtd already answers on qemu:///system. It defines, starts and at the end destroys and undefines one
domain ``zjc-peer-<tag>``, and removes its files. Usage (root, repository root, after ``make setup``)::

    /var/cache/zjusct-cloud/venv/bin/python bench/vm_start_peer.py [--pairs 2] [--ansible-peer] [--no-peer-warmup]

Exits non-zero only when a step fails.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "launcher"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402  bench/
from host_backend import (  # noqa: E402  bench/
    VENV_BIN,
    _ts,
    host_cleanup,
    host_setup,
    key_args,
    last_guest_boot,
    playbook,
    start_task,
)
from zjusct_launcher import config as cfgmod  # noqa: E402
from zjusct_launcher import identity, readiness  # noqa: E402

from tests.integration.launcher.harness import base_config, free_port  # noqa: E402

VM_DIR = "default_bench"  # the host backend's state/log name of vm_start.yml's VM (-e owner=bench)
URI = "qemu:///system"
LIBVIRT_PACKAGES = ["libvirt-daemon", "libvirt-daemon-driver-qemu", "libvirt-clients"]
BOOT_TIMEOUT = 1500.0  # s, one TCG boot on a loaded 2-core machine
TICK = os.sysconf("SC_CLK_TCK")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def virsh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``virsh -c qemu:///system ARGS``; with ``check``, a failure ends the run with virsh's message."""
    proc = subprocess.run(["virsh", "-q", "-c", URI, *args], capture_output=True, text=True, check=False,
                          timeout=300)
    if check and proc.returncode != 0:
        raise SystemExit(f"virsh {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def proc_start_boottime(pid: int) -> float:
    """The start of process ``pid`` in CLOCK_BOOTTIME seconds (/proc/<pid>/stat field 22, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / TICK


def wall_to_boottime(epoch: float) -> float:
    """An epoch time (time.time()) as CLOCK_BOOTTIME seconds, by the offset between the two clocks now."""
    return epoch - (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))


def vmm_started(log: Path) -> dict[str, Any]:
    """The launcher's last ``vmm started`` log line (pid, argv, ts) in ``log``."""
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("msg") == "vmm started"][-1]


def qemu_params(argv: list[str]) -> dict[str, Any]:
    """vCPUs, memory, TCG cache, kernel, initrd, cmdline and root-disk cache of a launcher-built QEMU argv."""
    def opt(name: str) -> str:
        return argv[argv.index(name) + 1]
    accel = opt("-accel")
    if not accel.startswith("tcg,tb-size="):
        raise SystemExit(f"our VM did not run under TCG ({accel}); the peer is TCG only")
    root = next(json.loads(argv[i + 1]) for i, a in enumerate(argv)
                if a == "-blockdev" and json.loads(argv[i + 1]).get("node-name") == "root")
    return {"vcpus": int(opt("-smp")), "memory_mib": int(opt("-m").rstrip("M")),
            "tb_mib": int(accel.split("=", 1)[1]), "kernel": opt("-kernel"), "initrd": opt("-initrd"),
            "cmdline": opt("-append"), "disk": root["file"]["filename"],
            "cache": "none" if root["cache"]["direct"] else "writeback"}


def domain_xml(name: str, p: dict[str, Any], root: Path, port: int) -> str:
    """The libvirt domain: TCG, direct kernel boot, root + config disks on pcie.0 at the launcher's addresses,
    serial to a file, user networking with ``127.0.0.1:port`` -> guest port 22."""
    def disk(path: Path, dev: str, slot: str, readonly: bool = False) -> str:
        return (f"<disk type='file' device='disk'><driver name='qemu' type='raw' cache={quoteattr(p['cache'])}/>"
                f"<source file={quoteattr(str(path))}/><target dev='{dev}' bus='virtio'/>"
                f"{'<readonly/>' if readonly else ''}"
                f"<address type='pci' domain='0x0000' bus='0x00' slot='{slot}' function='0x0'/></disk>")
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{escape(name)}</name>
  <memory unit='MiB'>{p['memory_mib']}</memory>
  <vcpu>{p['vcpus']}</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type><kernel>{escape(str(root / 'vmlinuz'))}</kernel>
    <initrd>{escape(str(root / 'initrd.img'))}</initrd><cmdline>{escape(p['cmdline'])}</cmdline></os>
  <features><acpi/><tcg><tb-cache unit='MiB'>{p['tb_mib']}</tb-cache></tcg></features>
  <cpu mode='maximum'/>
  <on_reboot>destroy</on_reboot>
  <devices>
    {disk(root / 'root.raw', 'vda', '0x03')}
    {disk(root / 'identity.tar', 'vdb', '0x04', readonly=True)}
    <serial type='file'><source path={quoteattr(str(root / 'serial.log'))}/><target port='0'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/><qemu:arg value='user,id=peernet,hostfwd=tcp:127.0.0.1:{port}-:22'/>
    <qemu:arg value='-device'/><qemu:arg value='virtio-net-pci,netdev=peernet,bus=pcie.0,addr=0x5'/>
  </qemu:commandline>
</domain>
"""


class Libvirt:
    """libvirtd and virtlogd for the run: the ones that answer already, else started here as children."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Libvirt:
        if shutil.which("virsh") is None or shutil.which("libvirtd") is None:
            if os.geteuid() != 0:
                raise SystemExit(f"libvirt is missing: apt-get install --no-install-recommends "
                                 f"{' '.join(LIBVIRT_PACKAGES)} (or run this as root)")
            print(f"installing the peer: apt-get install --no-install-recommends {' '.join(LIBVIRT_PACKAGES)}",
                  flush=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *LIBVIRT_PACKAGES],
                           check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if virsh("version", check=False).returncode == 0:
            print("using the libvirtd that already answers on qemu:///system", flush=True)
            return self
        for group in ("kvm", "libvirt-qemu"):
            if subprocess.run(["getent", "group", group], capture_output=True, check=False).returncode != 0:
                print(f"creating the group {group} (libvirt's Debian default for QEMU)", flush=True)
                subprocess.run(["groupadd", "--system", group], check=True)
        if subprocess.run(["id", "libvirt-qemu"], capture_output=True, check=False).returncode != 0:
            print("creating the user libvirt-qemu (libvirt's Debian default for QEMU)", flush=True)
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-g",
                            "libvirt-qemu", "-G", "kvm", "libvirt-qemu"], check=True)
        for d in ("/var/log/libvirt", "/var/run/libvirt"):
            os.makedirs(d, exist_ok=True)
        for daemon in ("virtlogd", "libvirtd"):
            with open(self.work / f"{daemon}.log", "wb") as log:  # the child keeps its own descriptor
                self.procs.append(subprocess.Popen([daemon], stdin=subprocess.DEVNULL, stdout=log, stderr=log))
        deadline = time.monotonic() + 60
        while virsh("version", check=False).returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"libvirtd did not answer: {(self.work / 'libvirtd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        print(f"started virtlogd (pid {self.procs[0].pid}) and libvirtd (pid {self.procs[1].pid})", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            benchlib.stop_process(proc)


class Peer:
    """One libvirt domain booting the same guest as our VM."""

    def __init__(self, work: Path, params: dict[str, Any], pubkey: str) -> None:
        self.name = f"zjc-peer-{uuid.uuid4().hex[:6]}"
        self.dir = work
        self.port = free_port()
        os.chmod(work, 0o755)  # QEMU runs as libvirt-qemu
        for src, dst in ((params["kernel"], "vmlinuz"), (params["initrd"], "initrd.img")):
            shutil.copyfile(src, work / dst)
        image = Path(params["kernel"]).parent / "rootfs.raw"
        subprocess.run(["cp", "--sparse=always", str(image), str(work / "root.raw")], check=True, timeout=600)
        os.chmod(work / "root.raw", 0o644)  # the image set's files are read-only; libvirt chowns, not chmods
        # the config disk the launcher would build for user networking (static 10.0.2.15, this run's key)
        cfg = base_config(work, "peer", kernel=str(work / "vmlinuz"), initrd=str(work / "initrd.img"),
                          disk=str(work / "root.raw"), cmdline=params["cmdline"], port=self.port,
                          memory_mib=params["memory_mib"])
        cfg["identity"]["sshAuthorizedKeys"] = [pubkey]
        (work / "identity.tar").write_bytes(identity.build(cfgmod.parse(cfg)))
        (work / "domain.xml").write_text(domain_xml(self.name, params, work, self.port))
        virsh("define", str(work / "domain.xml"))

    def start(self) -> tuple[float, float, float]:
        """``virsh start`` and wait for the banner: (wall s, guest boot s = banner - QEMU process start, banner -
        ``virsh start``'s return). libvirt starts QEMU paused (-S), talks QMP, then resumes the vCPUs and returns:
        the first guest figure counts that set-up as guest time (the peer's overhead is then a lower bound), the
        second counts it as overhead."""
        t0 = time.monotonic()
        virsh("start", self.name)
        returned = time.clock_gettime(time.CLOCK_BOOTTIME)
        banner = readiness.wait_for_banner("127.0.0.1", self.port, BOOT_TIMEOUT, threading.Event())
        seen = time.clock_gettime(time.CLOCK_BOOTTIME)
        wall = time.monotonic() - t0
        if banner is None:
            raise SystemExit(f"peer: no SSH banner in {BOOT_TIMEOUT} s")
        return wall, seen - self.qemu_started(), seen - returned

    def qemu_started(self) -> float:
        """CLOCK_BOOTTIME s at which the running domain's QEMU process started (libvirt's pid file)."""
        return proc_start_boottime(int(Path(f"/run/libvirt/qemu/{self.name}.pid").read_text()))

    def start_by_playbook(self, env: dict[str, str]) -> tuple[float, float]:
        """The same start through Ansible: ``ansible-playbook`` of a play that runs ``virsh start`` with
        ``ansible.builtin.command`` and waits for the banner with ``ansible.builtin.wait_for`` (``search_regex:
        SSH-``; its ``sleep`` is whole seconds, so 1 s between attempts). (wall s, guest boot s = the banner as
        this script's own probe sees it, as in :meth:`start`, - QEMU process start): what the play adds after the
        banner (wait_for's next attempt, the module's return, the play's end) counts as overhead, like ours'
        "ready to task end" and "task end to exit"; libvirt's paused set-up counts as guest time, as in
        :meth:`start`. libvirt driven by a plain playbook, to hold against ours' playbook."""
        play = self.dir / "start.yml"
        play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
            {"name": "virsh start", "ansible.builtin.command": {"argv": ["virsh", "-c", URI, "start", self.name]}},
            {"name": "wait for the SSH banner", "ansible.builtin.wait_for": {
                "host": "127.0.0.1", "port": self.port, "search_regex": "SSH-", "sleep": 1,
                "timeout": int(BOOT_TIMEOUT)}}]}]))
        seen: list[float] = []
        done = threading.Event()

        def probe() -> None:
            if readiness.wait_for_banner("127.0.0.1", self.port, BOOT_TIMEOUT, done) is not None:
                seen.append(time.clock_gettime(time.CLOCK_BOOTTIME))

        prober = threading.Thread(target=probe, daemon=True)
        t0 = time.monotonic()
        prober.start()
        proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), str(play)], cwd=REPO, check=False, text=True,
                              capture_output=True, env=env)
        wall = time.monotonic() - t0
        done.set()
        prober.join()
        if proc.returncode != 0:
            raise SystemExit(f"peer through ansible-playbook failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        if not seen:
            raise SystemExit("peer through ansible-playbook: the play ended, this script's probe saw no banner")
        return wall, seen[0] - self.qemu_started()

    def shutdown(self) -> float:
        """``virsh shutdown --mode acpi`` until the domain is shut off: wall s."""
        t0 = time.monotonic()
        virsh("shutdown", self.name, "--mode", "acpi")
        while virsh("domstate", self.name).stdout.strip() != "shut off":
            if time.monotonic() - t0 > 300:
                raise SystemExit("peer: not shut off 300 s after virsh shutdown")
            time.sleep(0.1)
        return time.monotonic() - t0

    def remove(self) -> None:
        virsh("destroy", self.name, check=False)
        virsh("undefine", self.name, check=False)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/var/log/libvirt/qemu/{self.name}.log")


PHASES = ("ansible start-up to the task", "task start to launcher spawn", "launcher start-up",
          "launcher to QEMU start", "QEMU start to ready (guest)", "ready to task end", "task end to exit")


def ours_start(root: Path, config: dict[str, Any], env: dict[str, str],
               ) -> tuple[float, float, float, list[float]]:
    """vm_start.yml: (wall s, guest boot s = readyAt - QEMU process start, launcher spawned -> readyAt s, the
    seconds of each of :data:`PHASES`, from the wall clock times of: this script, the json callback's task start
    and end, the ``spawned-<boot>`` record, the launcher's ``launcher started`` and ``vmm started`` log lines
    and ``readyAt``; their sum is the wall time)."""
    t0 = time.time()
    wall, doc = playbook("vm_start", env, key_args(root), json_output=True)
    assert doc is not None
    task_start, task_end, _ = start_task(doc)
    state = Path(config["state_dir"]) / "vms" / VM_DIR
    boot = max(int(p.stem.split("-")[1]) for p in state.glob("boot-*.json"))
    ready_at = _ts(json.loads((state / f"ready-{boot}").read_text())["readyAt"])
    spawned = float(json.loads((state / f"spawned-{boot}").read_text())["time"])
    lines = [json.loads(x) for x in (Path(config["log_dir"]) / f"{VM_DIR}.launcher.log").read_text().splitlines()
             if x.startswith("{")]
    launched = _ts([x for x in lines if x.get("msg") == "launcher started"][-1]["ts"])
    vmm = [x for x in lines if x.get("msg") == "vmm started"][-1]
    marks = [t0, task_start, spawned, launched, _ts(vmm["ts"]), ready_at, task_end, t0 + wall]
    phases = [b - a for a, b in itertools.pairwise(marks)]
    return wall, wall_to_boottime(ready_at) - proc_start_boottime(vmm["pid"]), last_guest_boot(config), phases


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def measure(root: Path, config: dict[str, Any], env: dict[str, str], peer_dir: Path, pairs: int,
            warmup: bool = True, ansible_peer: bool = False,
            ) -> tuple[list[tuple[float, ...]], list[list[float]], list[tuple[float, float]]]:
    """The first boot of each side, then ``pairs`` alternating pairs (printed as they end); the peer's domain is
    removed before returning (libvirtd still runs). Returns the rows
    ``(ours wall, ours guest, peer wall, peer guest, ours stop, peer stop, peer guest from virsh's return)``,
    ours' phases per pair and, with ``ansible_peer``, the peer started through ansible-playbook as a third side
    of each round ``(wall, guest)`` (the three sides' order rotates per round)."""
    rows: list[tuple[float, ...]] = []
    profile: list[list[float]] = []
    through_ansible: list[tuple[float, float]] = []
    playbook("vm_start", env, key_args(root))  # creates the VM and its volume; first boot, not measured
    params = qemu_params(vmm_started(root / "log" / f"{VM_DIR}.launcher.log")["argv"])
    playbook("vm_stop", env)
    print(f"guest: {params['vcpus']} vCPU, {params['memory_mib']} MiB, TCG tb-size {params['tb_mib']} MiB, "
          f"cache {params['cache']}, cmdline {params['cmdline']!r}", flush=True)
    peer = Peer(peer_dir, params, (root / "key.pub").read_text().strip())
    try:
        if warmup:
            peer.start()  # first boot, not measured
            peer.shutdown()
        for i in range(pairs):
            before = load()
            sides: dict[str, Any] = {}
            sides_all = ["ours", "peer", *(["peer_ansible"] if ansible_peer else [])]
            k = i % len(sides_all)  # rotate: each side runs first in turn (with two: alternate)
            order = sides_all[k:] + sides_all[:k]
            for side in order:
                if side == "ours":
                    sides["ours"] = (*ours_start(root, config, env), playbook("vm_stop", env)[0])
                elif side == "peer":
                    sides["peer"] = (*peer.start(), peer.shutdown())
                else:
                    sides["peer_ansible"] = peer.start_by_playbook(env)
                    peer.shutdown()
            (aw, ag, al, phases, astop), (bw, bg, bgr, bstop) = sides["ours"], sides["peer"]
            rows.append((aw, ag, bw, bg, astop, bstop, bgr))
            profile.append(phases)
            if ansible_peer:
                cw, cg = sides["peer_ansible"]
                through_ansible.append((cw, cg))
                print(f"round {i + 1}, peer through ansible-playbook: wall {cw:.2f} s, guest {cg:.2f} s, overhead "
                      f"{cw - cg:.2f} s", flush=True)
            print(f"{'round' if ansible_peer else 'pair'} {i + 1} ({order[0]} first; load {before} -> {load()}): "
                  f"ours wall {aw:.2f} s, guest {ag:.2f} s, overhead {aw - ag:.2f} s (launcher spawned->ready "
                  f"{al:.2f} s: overhead {aw - al:.2f} s); peer wall {bw:.2f} s, guest {bg:.2f} s, overhead "
                  f"{bw - bg:.2f} s (guest from virsh start's return {bgr:.2f} s: overhead {bw - bgr:.2f} s); "
                  f"stop: vm_stop.yml {astop:.2f} s, virsh shutdown {bstop:.2f} s; ours' phases: "
                  + "; ".join(f"{name} {x:.2f}" for name, x in zip(PHASES, phases, strict=True)), flush=True)
        floors(root, config, env)
    finally:
        peer.remove()
    return rows, profile, through_ansible


def floors(root: Path, config: dict[str, Any], env: dict[str, str], runs: int = 3) -> None:
    """Two fixed costs inside ours' phases, timed alone (no guest runs): ``ansible-playbook`` of an empty play
    (interpreter and ansible-core start-up, inventory, exit) and the ``zjusct-launcher check`` subprocess the
    start runs before the spawn (on the last boot's config, in the cloud's netns, as supervisor.check_config)."""
    empty = root / "empty.yml"
    empty.write_text("- hosts: localhost\n  gather_facts: false\n  tasks: []\n")
    play = [benchlib.timed(lambda: subprocess.run([str(VENV_BIN / "ansible-playbook"), str(empty)], cwd=REPO,
                                                  env=env, check=True, capture_output=True))
            for _ in range(runs)]
    state = Path(config["state_dir"]) / "vms" / VM_DIR
    boot = max(int(p.stem.split("-")[1]) for p in state.glob("boot-*.json"))
    argv = ["ip", "netns", "exec", config["netns"], *config["launcher_command"], "check", "--config",
            str(state / f"boot-{boot}.json")]
    check_env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8", "PYTHONPATH": config["launcher_pythonpath"]}
    codes: list[int] = []
    check = [benchlib.timed(lambda: codes.append(subprocess.run(argv, env=check_env, capture_output=True,
                                                                check=False).returncode)) for _ in range(runs)]
    print(f"fixed costs alone (median of {runs}, load {load()}): ansible-playbook of an empty play "
          f"{statistics.median(play):.2f} s; launcher check subprocess {statistics.median(check):.2f} s "
          f"(exit codes {codes})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--ansible-peer", action="store_true",
                        help="a third side per round: the peer started by ansible-playbook (command + wait_for)")
    parser.add_argument("--no-peer-warmup", action="store_true",
                        help="skip the peer's unmeasured first boot (ours' first start creates the VM: always run)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (a netns for our cloud, libvirtd for the peer)")
    root = Path(tempfile.mkdtemp(prefix="zjc-bench-"))
    peer_dir = Path(tempfile.mkdtemp(prefix="zjc-peer-"))
    print(f"load average at the start {load()}", flush=True)
    config, env = host_setup(root)
    try:
        with Libvirt(root):
            rows, profile, through_ansible = measure(root, config, env, peer_dir, args.pairs,
                                                     warmup=not args.no_peer_warmup, ansible_peer=args.ansible_peer)
    finally:
        shutil.rmtree(peer_dir, ignore_errors=True)
        host_cleanup(root, config, env)
    med = {k: statistics.median(v) for k, v in {
        "aw": [r[0] for r in rows], "ag": [r[1] for r in rows], "ao": [r[0] - r[1] for r in rows],
        "bw": [r[2] for r in rows], "bg": [r[3] for r in rows], "bo": [r[2] - r[3] for r in rows],
        "astop": [r[4] for r in rows], "bstop": [r[5] for r in rows], "bor": [r[2] - r[6] for r in rows]}.items()}
    print(f"medians ({len(rows)} pairs, load average at the end {load()}): ours wall {med['aw']:.2f} s, guest "
          f"{med['ag']:.2f} s, overhead {med['ao']:.2f} s; peer wall {med['bw']:.2f} s, guest {med['bg']:.2f} s, "
          f"overhead {med['bo']:.2f} s (counting libvirt's paused set-up as overhead: {med['bor']:.2f} s)")
    print(f"vm_start overhead, same-run ratio ours/peer {med['ao'] / med['bo']:.2f} (goal <= 1: "
          f"{verdict(med['ao'] <= med['bo'])}); absolute {med['ao']:.2f} s (goal <= 3 s: {verdict(med['ao'] <= 3)})")
    if through_ansible:
        co = statistics.median(w - g for w, g in through_ansible)
        print(f"peer through ansible-playbook (virsh start + wait_for): overhead median {co:.2f} s; same-run ratio "
              f"ours/that {med['ao'] / co:.2f}")
    print("where ours' vm_start wall goes (medians, s): " + "; ".join(
        f"{name} {statistics.median(p[i] for p in profile):.2f}" for i, name in enumerate(PHASES)))
    print(f"stop, same-run ratio of walls vm_stop.yml/virsh shutdown {med['astop'] / med['bstop']:.2f} "
          f"({med['astop']:.2f} s vs {med['bstop']:.2f} s; no goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
