"""The SSH gateway on the layout site.yml makes, and when a key change takes effect (issue #39, input 7).

tests/e2e/host/test_ssh_gateway.py gives its gateway a private directory under /run; an operator's gateway lives
where the hypervisor role puts it, ``<dirname of hypervisor_config_path>/gateway``, inside the directory the role
creates for the host configuration. Here the real ``site.yml`` brings the host up with ``hypervisor_ssh_gateway:
true`` and nothing gateway-related overridden: its config directory is ``<root>/etc/zjusct-cloud`` (``<root>`` a
root-owned 0755 directory under /run standing in for ``/``; ``<root>/etc`` is 0755 like ``/etc``), its state,
volume and log directories are the role's own under a temporary directory, the VMM drops to the role's default
``hypervisor_vmm_uid_base``. The playbook and the modules run inside a network namespace standing in for the host
(``outside``, so the uplink's outer end and the gateway sshd live there, as they would in the host's); clients run
in ``world`` beyond it and reach the gateway at 192.0.2.1:2222. The test starts the gateway's sshd with the
``sshd_config`` site.yml wrote, as the role's systemd unit does where systemd runs services.

One guest of ``alice-<tag>`` boots once for the module; its spec lists the module's key (``cloud.key``, used by
the login checks, never changed) and a second key the re-key test swaps (``old`` -> ``new``), so every test passes
alone and in any order. The re-key test restarts it once (``vm_restart``).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw

from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS
from tests.e2e.host.conftest import REPO, VENV_BIN, Cloud, console_session, launcher_pids, listening, type_until
from tests.e2e.playbook_results import task_result

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(3600)]

GATEWAY, PORT = "192.0.2.1", 2222  # the host stand-in's address on the world side, the role's default port
DENIED = "Permission denied (publickey)"


class Layout:
    """The host site.yml brought up: its variables, the namespaces, the tenant's keys and VM."""

    def __init__(self, root: Path, tmp: Path, extra: dict, outside: str, world: str, cloud: Cloud) -> None:
        self.root, self.tmp, self.extra, self.outside, self.world, self.cloud = root, tmp, extra, outside, world, cloud
        self.owner = ""
        self.keys: dict = {}

    @property
    def config_dir(self) -> Path:
        return Path(self.extra["hypervisor_config_path"]).parent

    def on_host(self, argv: list, timeout: int = 1200) -> subprocess.CompletedProcess:
        """Run ``argv`` as root on the host stand-in (its network namespace), in the repository, with Ansible's env."""
        return subprocess.run(["ip", "netns", "exec", self.outside, *argv], cwd=REPO, env=self.cloud.env(),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def site(self) -> dict:
        """``ansible-playbook site.yml -e <the variables>`` on the host; the json callback's document."""
        proc = self.on_host([str(VENV_BIN / "ansible-playbook"), "site.yml", "-e", json.dumps(self.extra)],
                            timeout=1800)
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
        return json.loads(proc.stdout)

    def module(self, name: str, args: dict, timeout: int = 2000) -> dict:
        """One module task on the host; its result."""
        proc = self.on_host([str(VENV_BIN / "ansible"), "localhost", "-m", name, "-a", json.dumps(args)], timeout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]

    def playbook(self, name: str, *pairs: str, timeout: int = 2000) -> dict:
        argv = [str(VENV_BIN / "ansible-playbook"), f"playbooks/{name}.yml"]
        for pair in pairs:
            argv += ["-e", pair]
        proc = self.on_host(argv, timeout)
        assert proc.returncode == 0, f"{name}: {proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
        return json.loads(proc.stdout)

    def client_config(self, key: Path) -> Path:
        path = key.with_suffix(".ssh_config")
        path.write_text(f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
                        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  ConnectTimeout 30\n"
                        "  LogLevel INFO\n")
        return path

    def jump(self, key: Path, command: str = "hostname", via: str = "") -> subprocess.CompletedProcess:
        """``ssh -J <status.sshJumpHost> root@<status.sshEndpoint.host> <command>`` from the world (outside the host),
        ``key`` for both hops (``via``: this jump host instead of the status'). A login ssh itself could not make for
        a reason other than the key (a guest under load sends its banner a little before it takes logins) is tried
        again, 3 times 5 s apart."""
        status = self.cloud.vm(self.owner)["status"]
        argv = ["ip", "netns", "exec", self.world, "ssh", "-F", str(self.client_config(key)), "-J",
                via or status["sshJumpHost"], f"root@{status['sshEndpoint']['host']}", command]
        for _ in range(3):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False,
                                  stdin=subprocess.DEVNULL)
            if proc.returncode == 0 or DENIED in proc.stderr:
                return proc
            time.sleep(5)
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)

    def direct(self, key: Path) -> subprocess.CompletedProcess:
        """``ssh root@<guest> hostname`` from the cloud's namespace (root on the host), ``key`` only."""
        ip = self.cloud.vm(self.owner)["status"]["sshEndpoint"]["host"]
        argv = ["ip", "netns", "exec", self.cloud.config["netns"], "ssh", "-F", str(self.client_config(key)),
                f"root@{ip}", "hostname"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)

    def keys_file(self) -> str:
        return (self.config_dir / "gateway" / "keys" / gw.account_name(self.owner)).read_text()


def _pub(key: Path) -> str:
    return Path(f"{key}.pub").read_text().strip()


def _ssh_keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _changed_tasks(doc: dict) -> list:
    return [t["task"]["name"] for p in doc["plays"] for t in p["tasks"]
            if any(h.get("changed") for h in t["hosts"].values())]


@pytest.fixture(scope="module")
def layout(guest_image, tmp_path_factory):
    tag = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("gateway-layout")
    root = Path(f"/run/zjc-gws-{tag}")  # sshd's StrictModes refuses any directory under the world-writable /tmp
    outside, world, netns = f"zjc-gso-{tag}", f"zjc-gsw-{tag}", f"zjc-gs-{tag}"
    runtime = f"/run/zjc-gsr-{tag}"
    had_group = gw.existing_group_id() is not None
    made_privsep = not os.path.isdir("/run/sshd")
    for directory in (root, root / "etc"):
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    # the cloud's namespace too is made here, from the host: one that `ip netns add` makes inside `ip netns exec`
    # (where site.yml runs) is bound in that command's private mount namespace only, and unusable after it
    for ns in (outside, world, netns):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-n", outside, "link", "add", "zjw0", "type", "veth", "peer", "name", "eth0", "netns",
                    world], check=True)
    for ns, address in ((outside, "192.0.2.1/24"), (world, "192.0.2.2/24")):
        dev = "zjw0" if ns == outside else "eth0"
        subprocess.run(["ip", "-n", ns, "addr", "add", address, "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
    extra = {
        # where an operator's host keeps them, moved under <root> and the temporary directory
        "hypervisor_config_path": str(root / "etc" / "zjusct-cloud" / "host.json"),
        "hypervisor_state_dir": str(tmp / "var-lib"),
        "hypervisor_images_dir": str(Path(guest_image.dir).parent),  # the image role then only checks it
        "hypervisor_default_image": guest_image.manifest["name"],
        "hypervisor_runtime_dir": runtime,
        "hypervisor_log_dir": str(tmp / "var-log"),
        "hypervisor_netns": netns,
        "hypervisor_subnet": "10.219.0.0/24",
        "hypervisor_uplink_cidr": "100.64.219.0/30",
        "hypervisor_dns": ["192.0.2.2"],
        "hypervisor_install_packages": False,  # installed by hack/install-deps.sh; no network in the stand-in
        # the gateway as an operator turns it on; its port and directory are the role's defaults
        "hypervisor_ssh_gateway": True,
        "hypervisor_ssh_gateway_host": GATEWAY,
        # a shared, loaded 2-core test host: one boot slot per CPU for all lanes, TCG, long readiness
        "hypervisor_accel": os.environ.get("ZJUSCT_E2E_ACCEL", "tcg"),
        "hypervisor_max_concurrent_boots": TEST_BOOT_SLOTS,
        "hypervisor_boot_slot_dir": TEST_BOOT_SLOT_DIR,
        "hypervisor_readiness_timeout_seconds": 1800,
        "hypervisor_stop_timeout_seconds": 120,
        "hypervisor_tcg_translation_cache_mib": 128,
    }
    key = _ssh_keygen(tmp / "id_ed25519")
    config_path = Path(extra["hypervisor_config_path"])
    cloud = Cloud(config_path, {"netns": netns, "state_dir": extra["hypervisor_state_dir"]}, tmp, key, world)
    site = Layout(root, tmp, extra, outside, world, cloud)
    site.owner = f"alice-{tag}"
    site.keys = {"old": _ssh_keygen(tmp / "old_ed25519"), "new": _ssh_keygen(tmp / "new_ed25519")}
    sshd = None
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    try:
        first = site.site()
        assert first["stats"]["localhost"]["changed"] > 0
        cloud.config = json.loads(config_path.read_text())
        gateway_dir = cloud.config["gateway_dir"]
        assert gateway_dir == str(site.config_dir / "gateway")  # the role's default, not chosen by the test
        with open(tmp / "sshd.log", "w", encoding="utf-8") as log:
            sshd = subprocess.Popen(["ip", "netns", "exec", outside, "/usr/sbin/sshd", "-D", "-e", "-f",
                                     f"{gateway_dir}/sshd_config"], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not listening(outside, PORT):
            assert sshd.poll() is None, (tmp / "sshd.log").read_text()
            assert time.monotonic() < deadline, "the gateway sshd does not listen after 60 s"
            time.sleep(0.2)
        started = site.module("zjusct.cloud.cloudvm", {
            "name": site.owner, "owner": site.owner, "power_state": "running", "wait_timeout": 1900,
            "ssh_authorized_keys": [_pub(key), _pub(site.keys["old"])]})
        assert started["phase"] == "Running", started
        yield site
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(timeout=30)
            print("--- gateway sshd log (tail)\n" + (tmp / "sshd.log").read_text(errors="replace")[-3000:])
        for vm_dir in (Path(extra["hypervisor_state_dir"]) / "vms").glob("*"):
            for pid in launcher_pids(cloud, vm_dir.name.split("_", 1)[1], vm_dir.name.split("_", 1)[0]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for log in (tmp / "var-log").glob("*.log"):
            print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-2000:]}")
        for ns in (netns, outside, world):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["userdel", gw.account_name(site.owner)], check=False, capture_output=True)
        if not had_group:
            subprocess.run(["groupdel", gw.GROUP], check=False, capture_output=True)
        if made_privsep:
            shutil.rmtree("/run/sshd", ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _mode(path: Path) -> tuple:
    st = path.stat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def test_a_tenant_jumps_into_her_guest_through_the_gateway_on_the_site_layout(layout: Layout):
    """sshd, as zc-<owner>, reads its keys file inside the config directory site.yml made; the guest it opens runs
    under the role's own 0700 state and log directories with its VMM on its own uid (no path access needed)."""
    gid = grp.getgrnam(gw.GROUP).gr_gid
    assert _mode(layout.config_dir) == (0, gid, 0o710)  # the gateway's accounts may pass through, nobody else
    assert _mode(layout.config_dir / "gateway" / "keys") == (0, gid, 0o750)
    out = layout.jump(layout.cloud.key)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == layout.owner
    for directory in (layout.extra["hypervisor_state_dir"], layout.extra["hypervisor_log_dir"]):
        assert _mode(Path(directory)) == (0, 0, 0o700), directory
    vm = layout.cloud.vm(layout.owner)
    runtime = Path(layout.extra["hypervisor_runtime_dir"]) / "vms" / f"default_{layout.owner}"
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{int((runtime / 'vmm.pid').read_text())}/status").read_text().splitlines())
    expected = str(HostConfig().vmm_uid_base + int(vm["status"]["sshEndpoint"]["host"].rsplit(".", 1)[1]))
    assert status["Uid"].split() == [expected] * 4, status["Uid"]


def test_a_second_site_run_changes_nothing_and_keeps_the_gateway_open(layout: Layout):
    second = layout.site()
    assert second["stats"]["localhost"]["changed"] == 0, _changed_tasks(second)
    assert _mode(layout.config_dir) == (0, grp.getgrnam(gw.GROUP).gr_gid, 0o710)
    out = layout.jump(layout.cloud.key)
    assert out.returncode == 0 and out.stdout.strip() == layout.owner, out.stderr


def test_once_site_turns_the_gateway_off_no_status_or_summary_names_it_and_on_again_it_does(layout: Layout):
    """site.yml with hypervisor_ssh_gateway false: the gateway admits nobody any more, the VM's status (read, and
    after a vm_start that changes nothing) names no jump host and vm_start prints no tenant command through the
    gateway; the endpoint and the ProxyCommand stay. With the gateway on again all of it is back."""
    jump = f"{gw.account_name(layout.owner)}@{GATEWAY}:{PORT}"
    assert layout.cloud.vm(layout.owner)["status"]["sshJumpHost"] == jump
    on = dict(layout.extra)
    layout.extra = dict(on, hypervisor_ssh_gateway=False)
    try:
        layout.site()
        status = layout.cloud.vm(layout.owner)["status"]
        assert "sshJumpHost" not in status and status["phase"] == "Running", status
        assert status["sshEndpoint"]["port"] == 22 and status["sshProxyCommand"], status
        lines = task_result(layout.playbook("vm_start", f"owner={layout.owner}"), "Show the VM")["msg"]
        assert not [line for line in lines if "ssh -J" in line], lines
        # an sshd still running (here the test's; on systemd hosts the unit is stopped) admits nobody: no keys
        assert not (layout.config_dir / "gateway" / "keys").exists()
        through = layout.jump(layout.cloud.key, via=jump)
        assert through.returncode != 0 and DENIED in through.stderr, through
    finally:
        layout.extra = on
        layout.site()
    assert layout.cloud.vm(layout.owner)["status"]["sshJumpHost"] == jump
    through = layout.jump(layout.cloud.key)
    assert through.returncode == 0 and through.stdout.strip() == layout.owner, through.stderr
    lines = task_result(layout.playbook("vm_start", f"owner={layout.owner}"), "Show the VM")["msg"]
    assert lines[-2] == f"from outside the host: ssh -J {jump} root@{status['sshEndpoint']['host']}", lines
    # the console command the summary prints works on the role's layout (its shell, its launcher install)
    printed = f"ssh -t -p {PORT} {gw.account_name(layout.owner)}@{GATEWAY} console default/{layout.owner}"
    assert lines[-1] == f"serial console (detach: Ctrl-]): {printed}", lines
    session = console_session(layout.world, layout.client_config(layout.cloud.key), *printed.split()[2:])
    try:
        type_until(session, b"\r", f"root@{layout.owner}".encode())
        type_until(session, b"\x1d", b"detached")
        assert session.wait(timeout=60) == 0
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()


def test_a_key_change_takes_effect_at_the_next_boot_on_the_gateway_and_in_the_guest(layout: Layout):
    """Re-keying the running VM (old -> new) keeps boot N's keys on the gateway as in the guest: old still gets in
    both ways, new does not, and the task says so; after vm_restart (boot N + 1) new gets in and old does not."""
    old, new = layout.keys["old"], layout.keys["new"]
    boot = int(layout.cloud.vm(layout.owner)["spec"]["bootID"])
    rekeyed = layout.module("zjusct.cloud.cloudvm", {"name": layout.owner, "owner": layout.owner,
                                                     "power_state": "running",
                                                     "ssh_authorized_keys": [_pub(layout.cloud.key), _pub(new)]})
    assert (rekeyed["changed"], rekeyed["boot_id"], rekeyed["phase"]) == (True, boot, "Running"), rekeyed
    assert rekeyed["ssh_authorized_keys_boot_id"] == boot + 1
    assert any(w.startswith(f"spec.sshAuthorizedKeys change takes effect at the next boot (bootID {boot + 1}): boot"
                            f" {boot} keeps its keys in the guest and on the host's SSH gateway")
               for w in rekeyed.get("warnings", [])), rekeyed.get("warnings")
    identity = _pub(old).split()[1]
    assert identity in layout.keys_file() and _pub(new).split()[1] not in layout.keys_file()
    through, inside = layout.jump(old), layout.direct(old)
    assert through.returncode == 0 and through.stdout.strip() == layout.owner, through.stderr
    assert inside.returncode == 0 and inside.stdout.strip() == layout.owner, inside.stderr
    through, inside = layout.jump(new), layout.direct(new)
    assert through.returncode != 0 and DENIED in through.stderr, through  # refused by the gateway
    assert inside.returncode != 0 and DENIED in inside.stderr, inside  # and by the guest

    restarted = layout.playbook("vm_restart", f"owner={layout.owner}", "wait_timeout=1900")
    vm = layout.cloud.vm(layout.owner)
    assert (vm["status"]["phase"], vm["status"]["bootID"]) == ("Running", boot + 1), (vm["status"], restarted["stats"])
    # vm_restart's summary says how to reach the guest as vm_start's does, the tenant's command included
    ip = vm["status"]["sshEndpoint"]["host"]
    assert task_result(restarted, "Show the VM")["msg"][1:] == [
        f"SSH: {ip}:22", f'ssh -o ProxyCommand="{vm["status"]["sshProxyCommand"]}" root@{ip}',
        f"from outside the host: ssh -J {vm['status']['sshJumpHost']} root@{ip}",
        f"serial console (detach: Ctrl-]): ssh -t -p {PORT} {gw.account_name(layout.owner)}@{GATEWAY} console "
        f"default/{layout.owner}"]
    assert _pub(new).split()[1] in layout.keys_file() and identity not in layout.keys_file()
    through, inside = layout.jump(new), layout.direct(new)
    assert through.returncode == 0 and through.stdout.strip() == layout.owner, through.stderr
    assert inside.returncode == 0 and inside.stdout.strip() == layout.owner, inside.stderr
    through, inside = layout.jump(old), layout.direct(old)
    assert through.returncode != 0 and DENIED in through.stderr, through
    assert inside.returncode != 0 and DENIED in inside.stderr, inside
