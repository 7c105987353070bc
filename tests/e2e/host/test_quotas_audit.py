"""Per-owner quotas and the audit trail on the single-host backend (docs/security.md, Quotas and Audit).

Real playbooks and modules against a private host store with real root volumes. The refusals happen
before any boot, so those tests keep their VMs Stopped; the concurrent-start test boots one real guest.
Every test uses its own owner, so the tests do not depend on each other.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import volume_path

from tests.e2e.playbook_results import failure, task_result

from .conftest import REPO, VENV_BIN, Cloud

pytestmark = [pytest.mark.netns, pytest.mark.timeout(2400)]

START = "Start the VM and wait until its SSH answers"


def module(cloud: Cloud, name: str, args: dict) -> dict:
    """Run ``zjusct.cloud.<name>`` once (a new ansible process) and return its localhost result."""
    proc = subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-m", f"zjusct.cloud.{name}", "-a",
                           json.dumps(args)], cwd=REPO, env=cloud.env(), capture_output=True, text=True,
                          timeout=900, check=False)
    doc = json.loads(proc.stdout)
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


def create_stopped(cloud: Cloud, name: str, owner: str, **extra: object) -> dict:
    result = module(cloud, "cloudvm", {"name": name, "owner": owner, **extra})
    assert not result.get("failed"), result
    return result["cloudvm"]


def volume_file(cloud: Cloud, name: str) -> Path:
    return Path(volume_path(cloud.config["volumes_dir"], f"{name}-root"))


def lease_of(cloud: Cloud, vm: dict) -> object:
    conn = sqlite3.connect(cloud.config["store_path"])
    try:
        return conn.execute("SELECT ipv4 FROM leases WHERE vm_uid = ?", (vm["metadata"]["uid"],)).fetchone()
    finally:
        conn.close()


def delete_all(cloud: Cloud, owner: str, *names: str) -> None:
    for name in names:
        cloud.playbook("vm_delete", f"owner={owner}", f"name={name}", "delete_volume=true", check=False)
    module(cloud, "owner_quota", {"owner": owner, "state": "absent"})


def test_vm_count_and_disk_quotas_refuse_a_create_and_leave_nothing(cloud: Cloud) -> None:
    owner = "quota-vms"
    try:
        module(cloud, "owner_quota", {"owner": owner, "vms": 1})
        create_stopped(cloud, "qv1", owner)
        refused = module(cloud, "cloudvm", {"name": "qv2", "owner": owner})
        assert refused.get("failed") and refused["reason"] == "QuotaExceeded", refused
        expected = f"vms: owner '{owner}' would use 2 of quota 1 VMs (in use 1, this request 1"
        assert refused["msg"].startswith(expected), refused["msg"]
        assert (refused["quota"], refused["limit"], refused["in_use"], refused["requested"]) == ("vms", 1, 1, 1)
        assert cloud.vm("qv2") == {} and not volume_file(cloud, "qv2").exists()

        # disk: the owner's volumes count whatever their VMs do; a new root volume over the limit is refused
        with HostStore(cloud.config["store_path"], read_only=True) as store:
            used_mib = int(store.get_volume("qv1-root")["size_mib"])
        quota = module(cloud, "owner_quota", {"owner": owner, "vms": 5, "disk_mib": used_mib + 10})
        assert quota["changed"] and quota["usage"]["disk_mib"] == used_mib and quota["usage"]["vms"] == 1, quota
        refused = module(cloud, "cloudvm", {"name": "qv2", "owner": owner})
        assert refused.get("failed") and refused["quota"] == "disk_mib", refused
        assert f"would use {2 * used_mib} of quota {used_mib + 10} MiB of disk (in use {used_mib}, this request" \
               f" {used_mib}" in refused["msg"], refused["msg"]
        assert cloud.vm("qv2") == {} and not volume_file(cloud, "qv2").exists()
        assert not list(Path(cloud.config["volumes_dir"]).glob("qv2*"))  # no half-copied file either

        # the operator's quota change and both refusals are in the audit trail, read by a new process
        records = module(cloud, "audit_info", {"owner": owner})["records"]
        seen = [(r["actor"], r["action"], r["subject"], r["result"], r["reason"]) for r in records]
        assert seen == [
            ("operator", "quota-set", f"quota/{owner}", "succeeded", ""),
            (owner, "create", "default/qv1", "succeeded", ""),
            (owner, "create", "default/qv2", "refused", "QuotaExceeded"),
            ("operator", "quota-set", f"quota/{owner}", "succeeded", ""),
            (owner, "create", "default/qv2", "refused", "QuotaExceeded"),
        ], seen
        assert records[2]["message"].startswith(f"vms: owner '{owner}' would use 2 of quota 1 VMs")
        assert all(r["ts"].endswith("Z") and "." in r["ts"] for r in records)
    finally:
        delete_all(cloud, owner, "qv1", "qv2")


def test_vcpu_quota_refuses_a_start_and_the_vm_stays_off(cloud: Cloud) -> None:
    owner = "quota-cpu"
    try:
        module(cloud, "owner_quota", {"owner": owner, "vcpus": 1, "memory_mib": 4096})
        vm = create_stopped(cloud, "qc1", owner, vcpus=2)
        doc = cloud.playbook("vm_start", f"owner={owner}", "name=qc1", check=False)
        msg = failure(doc)
        assert f"vcpus: owner '{owner}' would use 2 of quota 1 vCPUs (in use 0, this request 2, asked by vcpus)" \
            in msg, msg
        assert "ask the operator to raise owner_quota vcpus" in msg
        after = cloud.vm("qc1")
        assert after["spec"]["powerState"] == "Stopped" and after["spec"]["bootID"] == vm["spec"]["bootID"], after
        assert lease_of(cloud, after) is None
        assert not list((Path(cloud.config["state_dir"]) / "vms" / "default_qc1").glob("boot-*.json"))
        records = module(cloud, "audit_info", {"subject": "default/qc1"})["records"]
        assert [(r["action"], r["result"]) for r in records] == [("create", "succeeded"), ("start", "refused")]
        assert records[-1]["data"]["power_state"] == "running"

        # check mode predicts the refusal and writes nothing (no audit record either)
        checked = cloud.playbook("vm_start", f"owner={owner}", "name=qc1", check=False, options=("--check",))
        assert "would use 2 of quota 1 vCPUs" in failure(checked)
        assert len(module(cloud, "audit_info", {"subject": "default/qc1"})["records"]) == 2
    finally:
        delete_all(cloud, owner, "qc1")


def test_audit_trail_survives_a_reopened_store_and_names_the_operator_switch(cloud: Cloud) -> None:
    owner = "audit-own"
    try:
        create_stopped(cloud, "au1", owner)
        # an actor of this test's own: test_a_refusal_by_a_playbooks_lookup_is_audited's mallory acts in the same
        # store (the module's cloud), and audit_info by actor below must list only this test's records
        forbidden = module(cloud, "cloudvm", {"name": "au1", "owner": "mallory-au", "state": "absent"})
        assert forbidden.get("failed") and forbidden["reason"] == "Forbidden", forbidden
        deleted = module(cloud, "cloudvm", {"name": "au1", "owner": "ops", "operator": True, "state": "absent",
                                             "delete_volume": True})
        assert deleted["changed"], deleted
        with HostStore(cloud.config["store_path"], read_only=True) as store:  # a fresh connection: what is on disk
            records = store.audit(subject="default/au1")
        seen = [(r["actor"], r["operator"], r["action"], r["result"], r["owner"]) for r in records]
        assert seen == [(owner, False, "create", "succeeded", owner), ("mallory-au", False, "delete", "refused", owner),
                        ("ops", True, "delete", "succeeded", owner)], seen
        assert records[-1]["data"]["delete_volume"] is True
        assert "belongs to owner 'audit-own'" in records[1]["message"]
        assert [r["subject"] for r in module(cloud, "audit_info", {"actor": "mallory-au"})["records"]] == \
            ["default/au1"]
    finally:
        delete_all(cloud, owner, "au1")


@pytest.mark.guest
@pytest.mark.slow
def test_two_concurrent_starts_under_a_quota_of_one_admit_exactly_one(cloud: Cloud) -> None:
    """Two vm_start runs at once for two Stopped VMs of one owner whose quota allows one running VM."""
    owner = "quota-race"
    try:
        module(cloud, "owner_quota", {"owner": owner, "vcpus": 1})
        vms = {name: create_stopped(cloud, name, owner) for name in ("qr1", "qr2")}
        results: dict = {}

        def start(name: str) -> None:
            results[name] = cloud.playbook("vm_start", f"owner={owner}", f"name={name}", check=False)

        threads = [threading.Thread(target=start, args=(name,)) for name in vms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [name for name, doc in results.items() if doc["rc"] == 0]
        assert len(ok) == 1, {n: d.get("raw", d.get("stderr"))[-2000:] for n, d in results.items()}
        winner, loser = ok[0], next(n for n in vms if n != ok[0])
        assert task_result(results[winner], START)["phase"] == "Running"
        msg = failure(results[loser])
        assert f"vcpus: owner '{owner}' would use 2 of quota 1 vCPUs (in use 1, this request 1" in msg, msg
        assert cloud.vm(winner)["status"]["phase"] == "Running"
        lost = cloud.vm(loser)
        assert lost["spec"]["powerState"] == "Stopped" and lease_of(cloud, lost) is None, lost
        outcomes = {r["subject"]: r["result"] for r in module(cloud, "audit_info", {"owner": owner})["records"]
                    if r["action"] == "start"}
        assert outcomes == {f"default/{winner}": "succeeded", f"default/{loser}": "refused"}, outcomes
    finally:
        delete_all(cloud, owner, "qr1", "qr2")


def test_a_refusal_by_a_playbooks_lookup_is_audited(cloud: Cloud) -> None:
    """vm_stop, vm_restart and vm_backup refuse another owner's VM when they look it up, before any module acts
    on it (cloudvm_info's authorize): a tenant probing a neighbour's VM leaves a record naming her."""
    owner = "audit-probe"
    try:
        create_stopped(cloud, "ap1", owner)
        for playbook in ("vm_stop", "vm_restart", "vm_backup"):
            doc = cloud.playbook(playbook, "owner=mallory", "name=ap1", check=False)
            assert f"owner: 'mallory' may not act on CloudVM default/ap1, which belongs to owner '{owner}'" \
                in failure(doc), (playbook, failure(doc))
        records = module(cloud, "audit_info", {"subject": "default/ap1"})["records"]
        seen = [(r["actor"], r["action"], r["result"], r["reason"], r["owner"]) for r in records[1:]]
        assert seen == [("mallory", action, "refused", "Forbidden", owner) for action in ("stop", "restart", "backup")]
        assert all(r["ended"] for r in records), records
        assert cloud.vm("ap1")["spec"]["powerState"] == "Stopped"
    finally:
        delete_all(cloud, owner, "ap1")


@pytest.fixture
def held_slot(cloud: Cloud, tmp_path: Path) -> Iterator[Cloud]:
    """The same cloud (store, network, image) through a host config whose only boot slot the test holds: a start
    writes its spec and starts its launcher, which then waits without booting, so a vm_start waits for Running
    as long as the test likes (and is killed while it waits). The slot is released at teardown."""
    slots = tmp_path / "slots"
    slots.mkdir()
    config = dict(cloud.config, max_concurrent_boots=1, boot_slot_dir=str(slots), accel="tcg")
    path = tmp_path / "host-held.json"
    path.write_text(json.dumps(config))
    fd = os.open(slots / "slot-0.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield dataclasses.replace(cloud, config_path=path, config=config)
    finally:
        os.close(fd)


def _start_and_kill(cloud: Cloud, owner: str, name: str, sig: int) -> tuple[dict, int]:
    """Run vm_start for a Stopped VM, wait until its spec asks for the next boot (written by the module while
    it then waits for Running), send ``sig`` to the playbook's whole process group; return the VM and the
    playbook's exit status."""
    before = create_stopped(cloud, name, owner)
    argv = [str(VENV_BIN / "ansible-playbook"), "playbooks/vm_start.yml", "-e", f"owner={owner}", "-e",
            f"name={name}", "-e", f"ssh_public_key_file={cloud.key}.pub"]
    proc = subprocess.Popen(argv, cwd=REPO, env=cloud.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def requested() -> dict | None:
            with HostStore(cloud.config["store_path"], read_only=True) as store:
                vm = store.get_vm("default", name)
            spec = (vm or {}).get("spec") or {}
            return vm if spec.get("bootID", 0) > before["spec"]["bootID"] else None

        deadline = time.monotonic() + 600
        while (vm := requested()) is None:
            assert proc.poll() is None, f"vm_start ended (rc {proc.returncode}) before it wrote the spec"
            assert time.monotonic() < deadline, "vm_start did not write the spec within 600 s"
            time.sleep(0.2)
        time.sleep(2)  # well inside the wait for Running (no guest can boot: the test holds the only slot)
        assert proc.poll() is None, "vm_start ended although no guest could boot"
        os.killpg(proc.pid, sig)
        return vm, proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize(("sig", "result", "reason"), [(signal.SIGKILL, "requested", ""),
                                                         (signal.SIGTERM, "failed", "Interrupted")])
def test_a_start_killed_while_it_waits_leaves_its_audit_record(held_slot: Cloud, sig: int, result: str,
                                                                reason: str) -> None:
    """The record of a start is written in the transaction that writes its spec: a run killed afterwards (an AWX
    cancel, SIGKILL) leaves the changed spec *and* the record of who asked for it; SIGTERM still records that
    the run was stopped."""
    owner, name = "audit-kill", f"ak-{signal.Signals(sig).name.lower()}"
    try:
        vm, _rc = _start_and_kill(held_slot, owner, name, sig)
        assert vm["spec"]["powerState"] == "Running"
        records = module(held_slot, "audit_info", {"subject": f"default/{name}"})["records"]
        assert [(r["action"], r["result"]) for r in records] == [("create", "succeeded"), ("start", result)], records
        start = records[-1]
        assert (start["actor"], start["owner"], start["reason"]) == (owner, owner, reason), start
        assert start["data"]["boot_id"] == vm["spec"]["bootID"] and start["data"]["power_state"] == "running"
        assert bool(start["ended"]) is (sig == signal.SIGTERM), start
        if sig == signal.SIGTERM:
            assert "stopped by SIGTERM" in start["message"], start
        else:
            assert "requested" in start["message"], start
    finally:
        delete_all(held_slot, owner, name)
