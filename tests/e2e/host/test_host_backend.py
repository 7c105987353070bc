"""The single-host cloud end to end: real playbooks, real QEMU guests, real bridge/TAP/nftables.

The tests run in order and share two VMs (alice, bob) to keep the number of guest boots small
(each TCG boot costs tens of seconds on these machines).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.inventory_host.inventory_host_helpers import ping_via_inventory

from .conftest import Cloud, launcher_pids

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(2400)]


def recap(doc: dict) -> dict:
    return doc["stats"]["localhost"]


def task_result(doc: dict, task_name: str) -> dict:
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == task_name:
                return task["hosts"]["localhost"]
    raise KeyError(task_name)


START = "Start the VM and wait until its SSH answers"


def test_bad_input_fails_before_anything_is_created(cloud: Cloud):
    for extra, field in ((("owner=carol", "memory_mib=8192"),
                          "memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): 8192 is above the maximum 4096"),
                         (("owner=Alice!",), "'Alice!' is not a DNS label"),
                         (("owner=carol", "image=no-such-image"), "image: 'no-such-image' is not a built image set")):
        doc = cloud.playbook("vm_start", *extra, check=False)
        assert doc["rc"] != 0
        assert field in str(doc), doc.get("raw", "")[-2000:]
    assert cloud.vm("carol") == {}
    volumes = Path(cloud.config["volumes_dir"])
    assert not volumes.exists() or list(volumes.iterdir()) == []


def test_start_stop_start_keeps_data_and_second_runs_change_nothing(cloud: Cloud):
    first = cloud.playbook("vm_start", "owner=alice")
    vm = task_result(first, START)
    assert vm["changed"] is True and vm["phase"] == "Running" and vm["boot_id"] == 1
    ip = vm["cloudvm"]["status"]["sshEndpoint"]["host"]
    out = cloud.ssh(ip, "hostname && echo persisted > /root/marker && sync")
    assert out.returncode == 0 and out.stdout.split()[0] == "alice", out.stderr

    again = cloud.playbook("vm_start", "owner=alice")
    assert recap(again)["changed"] == 0
    assert task_result(again, START)["boot_id"] == 1

    stopped = cloud.playbook("vm_stop", "owner=alice")
    result = task_result(stopped, "Stop the VM and wait until it is Stopped")
    assert result["phase"] == "Stopped" and result["changed"] is True
    assert launcher_pids(cloud, "alice") == []
    assert recap(cloud.playbook("vm_stop", "owner=alice"))["changed"] == 0

    second = task_result(cloud.playbook("vm_start", "owner=alice"), START)
    assert second["phase"] == "Running" and second["boot_id"] == 2
    out = cloud.ssh(ip, "cat /root/marker")
    assert out.stdout.strip() == "persisted", out.stderr


def test_inventory_lists_alice_and_ansible_reaches_her_guest(cloud: Cloud):
    """The dynamic inventory (inventory/cloudvm.yml, host source) groups alice's VM and Ansible pings it."""
    graph = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/cloudvm.yml",
                            "--graph"], cwd=str(Path(__file__).parents[3]), env=cloud.env(), capture_output=True,
                           text=True, timeout=120, check=True).stdout
    assert "@owner_alice:" in graph and "alice.default" in graph, graph
    ping = ping_via_inventory(cloud.config_path, "alice", cloud.key, cloud.env())
    assert '"ping": "pong"' in ping.stdout, ping.stdout + ping.stderr


def test_concurrent_starts_boot_once(cloud: Cloud):
    results = []

    def run():
        results.append(cloud.playbook("vm_start", "owner=bob", "guaranteed_mbps=20", "ceil_mbps=20", check=False))

    threads = [threading.Thread(target=run) for _ in range(2)]
    seen_max = 0
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen_max = max(seen_max, len(launcher_pids(cloud, "bob")))
        time.sleep(0.2)
    assert all(r["rc"] == 0 for r in results), [r.get("raw", "")[-2000:] for r in results]
    boot_ids = {task_result(r, START)["boot_id"] for r in results}
    assert boot_ids == {1}
    assert seen_max == 1
    assert sorted(os.listdir(Path(cloud.config["state_dir"]) / "vms" / "default_bob")).count("boot-1.json") == 1
    assert not (Path(cloud.config["state_dir"]) / "vms" / "default_bob" / "boot-2.json").exists()


def test_owners_are_isolated_from_each_other(cloud: Cloud):
    alice, bob = cloud.vm("alice"), cloud.vm("bob")
    a_ip, b_ip = alice["status"]["sshEndpoint"]["host"], bob["status"]["sshEndpoint"]["host"]
    gw = cloud.config["subnet"].rsplit(".", 1)[0] + ".1"
    # a one-shot TCP service on the bridge's host side proves bob's network works
    server = subprocess.Popen(
        ["ip", "netns", "exec", cloud.config["netns"], sys.executable, "-c",
         f"import socket; s = socket.create_server(('{gw}', 8022)); c, _ = s.accept(); c.sendall(b'OK-gw')"])
    try:
        time.sleep(1)
        probe = "timeout 8 bash -c 'exec 3<>/dev/tcp/{}/{} && head -c 5 <&3'"
        to_gw = cloud.ssh(b_ip, probe.format(gw, 8022))
        assert to_gw.stdout == "OK-gw", to_gw.stderr
        to_alice = cloud.ssh(b_ip, probe.format(a_ip, 22))
        assert to_alice.returncode != 0 and "SSH-" not in to_alice.stdout
        to_bob = cloud.ssh(a_ip, probe.format(b_ip, 22))
        assert to_bob.returncode != 0 and "SSH-" not in to_bob.stdout
    finally:
        server.kill()
        server.wait()


def test_bandwidth_spec_shapes_the_guest(cloud: Cloud):
    """bob started with 20 Mbit/s: his TAP has the HTB class, and a download into the guest is held to it."""
    bob = cloud.vm("bob")
    assert bob["spec"]["network"]["bandwidth"] == {"guaranteedMbps": 20, "ceilMbps": 20, "priority": 0}
    lease = sqlite3.connect(cloud.config["store_path"]).execute(
        "SELECT tap FROM leases WHERE vm_uid = ?", (bob["metadata"]["uid"],)).fetchone()
    classes = subprocess.run(["tc", "-n", cloud.config["netns"], "class", "show", "dev", lease[0]],
                             capture_output=True, text=True, check=True).stdout
    assert "rate 20Mbit ceil 20Mbit" in classes, classes
    gw = cloud.config["subnet"].rsplit(".", 1)[0] + ".1"
    size = 4 * 1024 * 1024
    code = (f"import socket, time; s = socket.create_server(('{gw}', 8023)); c, _ = s.accept(); "
            f"t = time.monotonic(); c.sendall(b'x' * {size}); c.shutdown(socket.SHUT_WR); c.recv(1); "
            "print(time.monotonic() - t)")
    server = subprocess.Popen(["ip", "netns", "exec", cloud.config["netns"], sys.executable, "-c", code],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    got = cloud.ssh(bob["status"]["sshEndpoint"]["host"],
                    f"timeout 60 bash -c 'exec 3<>/dev/tcp/{gw}/8023; head -c {size} <&3 | wc -c'", timeout=90)
    out, _ = server.communicate(timeout=90)
    assert got.stdout.strip() == str(size), got.stderr
    mbps = size * 8 / float(out.strip()) / 1e6
    assert mbps <= 20 * 1.1, f"{mbps:.1f} Mbit/s through a 20 Mbit/s class"


def test_guests_reach_the_outside_through_nat(cloud: Cloud):
    """bob's guest connects to a server in the 'outside' namespace; the server sees the uplink address."""
    b_ip = cloud.vm("bob")["status"]["sshEndpoint"]["host"]
    outside = cloud.config["uplink_netns"]
    server = subprocess.Popen(
        ["ip", "netns", "exec", outside, sys.executable, "-c",
         "import socket; s = socket.create_server(('198.51.100.1', 8080)); c, a = s.accept();"
         " c.sendall(a[0].encode())"])
    try:
        time.sleep(1)
        seen = cloud.ssh(b_ip, "timeout 8 bash -c 'exec 3<>/dev/tcp/198.51.100.1/8080 && head -c 40 <&3'"
                               " && echo && cat /etc/resolv.conf")
    finally:
        server.kill()
        server.wait()
    assert seen.returncode == 0, seen.stderr
    lines = seen.stdout.splitlines()
    assert lines[0] == "100.64.213.2", seen.stdout  # masqueraded to the uplink's inner address
    assert "nameserver 198.51.100.1" in seen.stdout


def test_case_L2_killed_launcher_is_not_running(cloud: Cloud):
    assert cloud.vm("bob")["status"]["phase"] == "Running"
    for pid in launcher_pids(cloud, "bob"):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    status = {}
    while time.monotonic() < deadline:
        status = cloud.vm("bob")["status"]
        if status["phase"] != "Running":
            break
        time.sleep(1)
    assert status["phase"] == "Failed" and status["reason"] == "LauncherLost", status


def test_case_L3_stop_then_immediate_start_never_overlaps(cloud: Cloud):
    counts = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            counts.append(len(launcher_pids(cloud, "alice")))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        env = cloud.env()
        ansible = str(Path(env["PATH"].split(":")[0]) / "ansible")
        subprocess.run([ansible, "localhost", "-m", "zjusct.cloud.cloudvm", "-a",
                        "name=alice power_state=stopped wait=false"], cwd=str(Path(__file__).parents[3]),
                       env=env, check=True, capture_output=True, timeout=120)
        started = task_result(cloud.playbook("vm_start", "owner=alice"), START)
    finally:
        stop.set()
        watcher.join()
    assert started["phase"] == "Running" and started["boot_id"] == 3
    assert max(counts) == 1


def test_case_L6_delete_leaves_nothing_behind(cloud: Cloud):
    for owner in ("alice", "bob"):
        vm = cloud.vm(owner)
        doc = cloud.playbook("vm_delete", f"owner={owner}")
        assert task_result(doc, "Delete the VM")["changed"] is True
        assert launcher_pids(cloud, owner) == []
        assert not (Path(cloud.config["state_dir"]) / "vms" / f"default_{owner}").exists()
        assert not (Path(cloud.config["runtime_dir"]) / "vms" / f"default_{owner}").exists()
        assert cloud.vm(owner) == {}
        assert vm["metadata"]["uid"]
    links = subprocess.run(["ip", "-n", cloud.config["netns"], "-o", "link", "show"], capture_output=True,
                           text=True, check=True).stdout
    assert "zjt" not in links
    # volumes are kept by default; the lease table is empty
    assert sorted(p.name for p in Path(cloud.config["volumes_dir"]).iterdir()) == ["alice-root.raw", "bob-root.raw"]
    conn = sqlite3.connect(cloud.config["store_path"])
    assert conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
    # a second delete changes nothing
    assert recap(cloud.playbook("vm_delete", "owner=alice"))["changed"] == 0
