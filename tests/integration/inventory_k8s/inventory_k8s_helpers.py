"""Helpers for the inventory plugin against the real control plane.

* :class:`CloudVMWriter` creates CloudVMs and writes their status through the status subresource
  (merge patch), as the CloudVM controller does: no controller runs in these tests, so the test
  plays it and says so.
* :func:`run_inventory` runs ``ansible-inventory`` from this checkout and parses ``--list``.
* Run as a script (``python inventory_k8s_helpers.py KUBECONFIG NAMESPACE NAME OWNER``) it starts a
  VM the way a playbook task would: create the CloudVM, then report it Running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(os.environ.get("ZJUSCT_VENV", "/var/cache/zjusct-cloud/venv")) / "bin"
CRD_FILE = REPO / "config" / "crd" / "cloudvms.cloud.zjusct.io.yaml"
AGGREGATE_ROLES = REPO / "config" / "rbac" / "aggregate-roles.yaml"
RUN_TIMEOUT = 300  # seconds for one ansible-inventory / ansible-playbook run


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of a manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class CloudVMWriter:
    """Create CloudVMs (as a user would) and report their status (as the controller would)."""

    api: Any  # kubernetes.client.CustomObjectsApi

    def create(self, ns: str, name: str, owner: str = "alice", labels: dict | None = None,
               vcpus: int = 1, memory_mib: int = 512) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM",
                "metadata": {"name": name, "labels": labels or {}},
                "spec": {"owner": owner, "rootVolumeClaim": f"{name}-root", "vcpus": vcpus,
                         "memoryMiB": memory_mib, "powerState": "Running", "bootID": 1}}
        return dict(self.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body))

    def report(self, ns: str, name: str, phase: str, ip: str = "192.0.2.10", port: int = 22,
               node: str = "node-a") -> dict:
        """Write status as the controller does: phase, boot, node and, once Running, the SSH endpoint."""
        status: dict[str, Any] = {"phase": phase, "reason": "SSHReady" if phase == "Running" else phase,
                                  "bootID": 1, "node": node}
        if phase == "Running":
            status["sshEndpoint"] = {"host": ip, "port": port}
        return dict(self.api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                                   {"status": status}))

    def start(self, ns: str, name: str, owner: str = "alice", **kwargs: Any) -> dict:
        """Create a CloudVM and report it Running (the controller's job, played here)."""
        self.create(ns, name, owner, **kwargs)
        return self.report(ns, name, "Running")


def write_inventory(path: Path, **options: Any) -> Path:
    """Write an inventory source for the plugin (``path`` must end with cloudvm.yml)."""
    path.write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", **options}, sort_keys=False))
    return path


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_INVENTORY_UNPARSED_FAILED="1")
    for key in [k for k in env if k.startswith("K8S_AUTH_")]:
        del env[key]
    env.update(extra)
    return env


@dataclass
class InventoryRun:
    rc: int
    inventory: dict
    stdout: str
    stderr: str

    def hosts(self) -> set[str]:
        return set(self.inventory.get("_meta", {}).get("hostvars", {}))

    def group(self, name: str) -> set[str]:
        return set(self.inventory.get(name, {}).get("hosts", []))

    def hostvars(self, host: str) -> dict:
        return dict(self.inventory["_meta"]["hostvars"][host])


UNSAFE = "__ansible_unsafe"


def plain(obj: dict) -> Any:
    """json object_hook: ansible-inventory marks strings that came from data (not from the inventory
    file) as ``{"__ansible_unsafe": value}`` so that consumers never template them; unwrap them."""
    return obj[UNSAFE] if set(obj) == {UNSAFE} else obj


def run_inventory(source: Path, *args: str, env: dict | None = None, check: bool = True) -> InventoryRun:
    """``ansible-inventory -i source --list [args]`` from the checkout; JSON parsed when rc == 0."""
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(source), "--list", *args], cwd=REPO,
                          env=env or ansible_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          check=False)
    # with -v.. Ansible prints its version banner on stdout before the JSON document
    start = 0 if proc.stdout.startswith("{") else proc.stdout.find("\n{\n") + 1
    doc = json.loads(proc.stdout[start:], object_hook=plain) if proc.returncode == 0 and start >= 0 else {}
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return InventoryRun(proc.returncode, doc, proc.stdout, proc.stderr)


def run_playbook(playbook: Path, source: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``ansible-playbook -i source playbook`` from the checkout."""
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(source), str(playbook)], cwd=REPO,
                          env=env or ansible_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          check=False)


def start_vm_command(kubeconfig: Path, namespace: str, name: str, owner: str) -> list[str]:
    """argv that starts a VM through this file's ``__main__`` (for a playbook's command task); the collection's
    ``.collections`` link on its PYTHONPATH, as tests/conftest.py puts it on pytest's ``sys.path``."""
    return ["env", f"PYTHONPATH={REPO / '.collections'}", sys.executable, str(Path(__file__)), str(kubeconfig),
            namespace, name, owner]


def names(vms: Iterable[str], namespace: str) -> set[str]:
    """Default inventory host names of ``vms`` in ``namespace``."""
    return {f"{vm}.{namespace}" for vm in vms}


if __name__ == "__main__":
    from kubernetes import client, config

    kubeconfig, namespace, name, owner = sys.argv[1:5]
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
    CloudVMWriter(api).start(namespace, name, owner)
    print(f"started {namespace}/{name}")
