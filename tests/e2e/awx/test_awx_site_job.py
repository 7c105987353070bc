"""The operator's site job template (awx/job_templates.yml, ``site.yml``) run as AWX runs it.

ansible-runner with the extra vars AWX builds at launch (the survey's backend answer, the template's own extra
vars, ``awx_*``), no tty, events from the artifacts; the host backend's paths all point into a temporary
directory and a namespace of the test's own (as tests/e2e/host/test_site.py does). A second launch of the same
template changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.awx_runner import Job, credential_type, inject_credential, job_template, launch_extra_vars, run_job
from tests.e2e.host.site_helpers import private_host

pytestmark = [pytest.mark.netns, pytest.mark.guest]


def changed_tasks(job: Job) -> list[str]:
    return [e["event_data"].get("task", "") for e in job.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")]


@pytest.mark.timeout(3600)
def test_site_job_template_brings_the_host_up_and_a_second_launch_changes_nothing(guest_image, tmp_path: Path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[hypervisors]\nlocalhost ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
    jobs = []
    with private_host(guest_image, tmp_path, "zjc-aws", "10.215.0.0/24") as hypervisor_vars:
        netns, config = hypervisor_vars["hypervisor_netns"], Path(hypervisor_vars["hypervisor_config_path"])
        # what the operator puts into the template's extra vars for this host
        template_vars = {"zjusct_cloud_hosts": "hypervisors", **hypervisor_vars}
        for job_id in (1, 2):
            private = tmp_path / f"job{job_id}"
            injected = inject_credential(credential_type(), {"backend": "host", "host_config": str(config)}, private)
            extra = launch_extra_vars(job_template("site.yml"), {"zjusct_cloud_backend": "host"}, "admin",
                                      template_vars, job_id=job_id)
            job = run_job(private, "site.yml", extra, injected, str(inventory), env=env)
            assert job.status == "successful" and job.rc == 0, (job.failed_messages(), job.stdout[-3000:])
            assert job.stats["failures"] == {} and job.stats["dark"] == {}
            jobs.append(job)
        first, second = jobs
        assert first.stats["changed"].get("localhost", 0) > 0
        assert config.exists() and (tmp_path / "state" / "cloud.db").exists()
        links = subprocess.run(["ip", "-n", netns, "-o", "addr", "show", "dev", "zjbr0"], capture_output=True,
                               text=True, check=True).stdout
        assert "10.215.0.1/24" in links
        assert second.stats["changed"].get("localhost", 0) == 0, changed_tasks(second)
