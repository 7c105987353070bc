"""site.yml brings a host up, and a second run changes nothing.

Runs the real playbook against localhost with every path pointed into a temporary directory and
its own network namespace (the image set comes from the test cache, so the image role only checks
its manifest). The launcher is installed to its standard place, /usr/local/lib/zjusct-cloud.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.host.site_helpers import private_host

pytestmark = [pytest.mark.netns, pytest.mark.guest]

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


def run_site(extra: dict) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "site.yml", "-e", json.dumps(extra)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_site_brings_host_up_and_second_run_changes_nothing(guest_image, tmp_path):
    with private_host(guest_image, tmp_path, "zjc-site", "10.216.0.0/24",
                      hypervisor_owner_quotas={"alice": {"vms": 2, "vcpus": 4}}) as extra:
        netns = extra["hypervisor_netns"]
        first = run_site(extra)
        assert first["stats"]["localhost"]["changed"] > 0
        config = json.loads((tmp_path / "etc" / "host.json").read_text())
        assert config["netns"] == netns and config["store_path"] == str(tmp_path / "state" / "cloud.db")
        assert (tmp_path / "state" / "cloud.db").exists()
        conn = sqlite3.connect(tmp_path / "state" / "cloud.db")
        quota = conn.execute("SELECT vms, vcpus, memory_mib FROM quotas WHERE owner = 'alice'").fetchone()
        conn.close()
        assert quota == (2, 4, None)  # a limit left out is unlimited
        links = subprocess.run(["ip", "-n", netns, "-o", "addr", "show", "dev", "zjbr0"], capture_output=True,
                               text=True, check=True).stdout
        assert "10.216.0.1/24" in links
        version = subprocess.run(["/usr/local/bin/zjusct-launcher", "version"], capture_output=True, text=True,
                                 check=True).stdout
        assert "launcher.cloud.zjusct.io/v1" in version

        second = run_site(extra)
        changed = [t["task"]["name"] for p in second["plays"] for t in p["tasks"]
                   if any(h.get("changed") for h in t["hosts"].values())]
        assert second["stats"]["localhost"]["changed"] == 0, changed
