"""execution-environment.yml and bindep.txt: ``ansible-builder create`` produces a build context holding the
collection built from this checkout, the Python requirements, the system packages and the install steps."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def test_ansible_builder_create_makes_the_build_context(tmp_path: Path):
    work = tmp_path / "ee"
    work.mkdir()
    for name in ("execution-environment.yml", "bindep.txt", "requirements.txt"):
        shutil.copy(REPO / name, work / name)
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "dist"),
                    str(REPO)], check=True, capture_output=True, text=True, timeout=300)
    (tarball,) = (work / "dist").glob("zjusct-cloud-*.tar.gz")
    with tarfile.open(tarball) as tar:
        members = set(tar.getnames())
    assert {"plugins/modules/cloudvm.py", "plugins/inventory/cloudvm.py", "awx/job_templates.yml",
            "playbooks/vm_start.yml"} <= members
    assert not any(m.startswith(("tests/", ".collections", "dist/")) for m in members)

    context = tmp_path / "context"
    proc = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c",
                           str(context), "--output-filename", "Containerfile"], cwd=work, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = context / "_build"
    assert (build / "collections" / tarball.name).read_bytes() == tarball.read_bytes()
    assert (build / "requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    assert (build / "bindep.txt").read_text() == (REPO / "bindep.txt").read_text()
    assert not (build / "requirements.yml").exists()  # no Galaxy: the collections come with the ansible package
    assert any(line.startswith("ansible>=") for line in (build / "requirements.txt").read_text().splitlines())
    dockerfile = (context / "Containerfile").read_text()
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert f"ARG EE_BASE_IMAGE=\"{ee['images']['base_image']['name']}\"" in dockerfile
    assert "ansible-galaxy collection install --offline -p /usr/share/ansible/collections" in dockerfile
    assert "ansible-core>=2.19,<2.20" in dockerfile and "ansible-runner>=2.4,<3" in dockerfile


def test_bindep_lists_the_tools_the_jobs_run():
    proc = subprocess.run([str(BIN / "bindep"), "-b", "-f", str(REPO / "bindep.txt")], capture_output=True,
                          text=True, timeout=60, check=False)
    # bindep -b prints the packages missing on this (Debian) machine for its platform; rc 1 when some are missing
    listed = set(proc.stdout.split())
    assert listed <= {"openssh-client", "git", "ceph-common"}, proc.stdout + proc.stderr
    assert "openssh-clients" not in listed  # the rpm name is not picked on a dpkg platform
