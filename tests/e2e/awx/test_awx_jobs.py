"""The tenant job templates of awx/ run as AWX runs them, on real guests of the host backend (RBD root volumes).

Each job goes through ansible-runner (subprocess mode, no tty) with the extra vars AWX builds at launch — the
template's extra vars, the survey answers checked against the generated survey, awx_user_name and the other
awx_*/tower_* variables — and the environment and files of the zjusct.cloud credential type rendered from sample
inputs (tests/awx_runner.py). Assertions read the job events and stats from the runner's artifacts.

One scenario (guest boots cost minutes under TCG: two in total): alice starts her VM (leaving the optional name
blank, as older AWX versions pass it: ""), bob's job on alice's VM is refused and changes nothing, alice stops,
restarts (second boot), backs up (stopping it, at -vvv), restores into a new stopped VM, bob's restore of her backup
is refused, and she deletes both. No secret of the credential appears in any event or in stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.awx_runner import Injected, Job, credential_type, inject_credential, job_template, launch_extra_vars, run_job
from tests.ceph import Cluster
from tests.e2e.host.conftest import Cloud

pytestmark = [pytest.mark.ceph, pytest.mark.guest, pytest.mark.netns, pytest.mark.slow]


class Awx:
    """Launches the job templates of awx/job_templates.yml against one cloud, one private data dir per job."""

    def __init__(self, cloud: Cloud, ceph: Cluster, work: Path) -> None:
        self.cloud, self.work, self.job_id = cloud, work, 0
        self.inventory = work / "hosts.ini"
        self.inventory.write_text(f"[hypervisors]\nlocalhost ansible_connection=local "
                                  f"ansible_python_interpreter={sys.executable}\n")
        self.template_vars = {"zjusct_cloud_hosts": "hypervisors", "backup_dir": str(work / "backups")}
        self.keyring = Path(ceph.keyring).read_text()
        self.inputs = {"backend": "host", "host_config": str(cloud.config_path), "ceph_user": "admin",
                       "ceph_keyring": self.keyring}
        self.secret_key = next(line.split("=", 1)[1].strip() for line in self.keyring.splitlines() if "key" in line)

    def launch(self, playbook: str, user: str, answers: dict, verbosity: int = 0) -> Job:
        self.job_id += 1
        private = self.work / f"job{self.job_id}"
        injected: Injected = inject_credential(credential_type(), self.inputs, private)
        extra = launch_extra_vars(job_template(playbook), answers, user, self.template_vars, job_id=self.job_id)
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
        job = run_job(private, playbook, extra, injected, str(self.inventory), env=env, verbosity=verbosity)
        everything = job.stdout + "".join(json.dumps(e) for e in job.events)
        assert self.secret_key not in everything, f"job {self.job_id}: the Ceph key appeared in the job output"
        for secret in injected.secrets:
            assert secret not in everything, f"job {self.job_id}: a credential secret appeared in the job output"
        return job


def ok(job: Job) -> Job:
    assert job.status == "successful" and job.rc == 0, (job.failed_messages(), job.stdout[-3000:])
    assert job.stats["failures"] == {} and job.stats["dark"] == {}
    assert "localhost" in job.stats["ok"]
    return job


def refused(job: Job) -> str:
    assert job.status == "failed" and job.rc != 0
    assert job.stats["failures"].get("localhost") == 1
    return " | ".join(job.failed_messages())


@pytest.mark.timeout(5400)
def test_tenant_lifecycle_through_the_job_templates(rbd_cloud: Cloud, ceph_cluster: Cluster, tmp_path: Path):
    awx = Awx(rbd_cloud, ceph_cluster, tmp_path)
    pub = Path(f"{rbd_cloud.key}.pub").read_text().strip()

    start = ok(awx.launch("playbooks/vm_start.yml", "alice",
                          {"name": "", "vcpus": 1, "memory_mib": 512, "ssh_public_key": pub}))
    (res,) = start.task_results("Start the VM and wait until its SSH answers")
    assert res["phase"] == "Running" and res["changed"] is True
    assert res["cloudvm"]["metadata"]["name"] == "alice" and res["cloudvm"]["spec"]["owner"] == "alice"
    assert start.stats["changed"]["localhost"] >= 1
    ip = res["cloudvm"]["status"]["sshEndpoint"]["host"]
    assert rbd_cloud.ssh(ip, "true", timeout=120).returncode == 0

    # bob's job names alice's VM: refused before anything is done; alice's VM keeps running
    msg = refused(awx.launch("playbooks/vm_stop.yml", "bob", {"name": "alice"}))
    assert "'bob' may not act on CloudVM default/alice, which belongs to owner 'alice'" in msg
    msg = refused(awx.launch("playbooks/vm_delete.yml", "bob", {"name": "alice", "delete_volume": "true"}))
    assert "'bob' may not act on CloudVM default/alice, which belongs to owner 'alice'" in msg
    assert rbd_cloud.vm("alice")["status"]["phase"] == "Running"

    stop = ok(awx.launch("playbooks/vm_stop.yml", "alice", {}))
    assert stop.task_results("Stop the VM and wait until it is Stopped")[0]["phase"] == "Stopped"

    restart = ok(awx.launch("playbooks/vm_restart.yml", "alice", {}))
    (rs,) = restart.task_results("Restart the VM")
    assert rs["phase"] == "Running" and rs["boot_id"] == res["boot_id"] + 1

    backup = ok(awx.launch("playbooks/vm_backup.yml", "alice", {"stop_if_running": "true", "full": "true"},
                           verbosity=3))
    (bres,) = backup.task_results("Back up the root volume (refused while it is in use)")
    assert bres["type"] == "full" and bres["changed"] is True
    backup_id = bres["backup_id"]
    assert rbd_cloud.vm("alice")["status"]["phase"] == "Stopped"

    msg = refused(awx.launch("playbooks/vm_restore.yml", "bob", {"backup": backup_id}))
    assert f"owner: bob is not the owner alice of backup {backup_id}" in msg

    restore = ok(awx.launch("playbooks/vm_restore.yml", "alice", {"backup": backup_id, "start": "false"}))
    (rres,) = restore.task_results("Create the VM on the restored volume and start it")
    assert rres["cloudvm"]["metadata"]["name"] == "alice-restored" and rres["cloudvm"]["spec"]["owner"] == "alice"
    assert rbd_cloud.vm("alice-restored")["spec"]["rootVolumeClaim"] == "alice-restored-root"

    for name in ("alice-restored", "alice"):
        ok(awx.launch("playbooks/vm_delete.yml", "alice", {"name": name, "delete_volume": "true"}))
        assert rbd_cloud.vm(name) == {}
