"""Optional survey questions left blank: AWX 17 was reported to pass "" (ansible/awx#9525), AWX 24 passes null
(ansible/awx#16205), later versions leave the variable out (ansible/awx#16289). The playbooks treat all three as
"not given"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.awx_runner import credential_type, inject_credential, job_template, launch_extra_vars, run_job


@pytest.mark.parametrize("blank", ["", None, "omitted"])
def test_blank_vm_name_means_the_owners_vm(tmp_path: Path, blank):
    """vm_stop launched by alice with the name left blank looks up her VM default/alice (none exists here)."""
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"store_path": str(tmp_path / "cloud.db"), "state_dir": str(tmp_path / "state")}))
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[hypervisors]\nlocalhost ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n")
    injected = inject_credential(credential_type(), {"backend": "host", "host_config": str(config)}, tmp_path / "job")
    answers = {} if blank == "omitted" else {"name": ""}
    extra = launch_extra_vars(job_template("playbooks/vm_stop.yml"), answers, "alice",
                              {"zjusct_cloud_hosts": "hypervisors"})
    if blank is None:
        extra["name"] = None  # what AWX 24 stores for the blank answer
    job = run_job(tmp_path / "job", "playbooks/vm_stop.yml", extra, injected, str(inventory),
                  env={"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"})
    assert job.status == "failed" and job.failed_messages() == ["name: no VM default/alice"]
    (lookup,) = job.task_results("Look up the VM and check that it belongs to the acting owner")
    assert lookup["invocation"]["module_args"]["name"] == "alice"
