"""Helpers for the inventory's host source, also meant for the host backend's e2e test.

``ping_via_inventory`` is the quickstart's last step as a function: it lists the host's Running
VMs through ``inventory/cloudvm.yml`` (the exact file the quickstart uses) and runs
``ansible owner_<owner> -m ansible.builtin.ping`` through it, i.e. over SSH with the ProxyCommand
the host backend publishes. Call it from a test that has a real guest running, e.g.::

    from tests.integration.inventory_host.inventory_host_helpers import ping_via_inventory
    proc = ping_via_inventory(cloud.config_path, "alice", cloud.key, cloud.env())
    assert proc.returncode == 0 and '"ping": "pong"' in proc.stdout

It needs root (``ip netns exec`` in the ProxyCommand).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(os.environ.get("ZJUSCT_VENV", "/var/cache/zjusct-cloud/venv")) / "bin"
INVENTORY = REPO / "inventory" / "cloudvm.yml"
RUN_TIMEOUT = 300  # seconds


def host_env(config_path: Path, base: Optional[dict] = None) -> dict:
    """Environment that points the host source at ``config_path`` and uses this checkout's ansible.cfg."""
    env = dict(base if base is not None else os.environ)
    env.update(ZJUSCT_CLOUD_CONFIG=str(config_path), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PATH=f"{VENV_BIN}:{env.get('PATH', '')}", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_INVENTORY_UNPARSED_FAILED="1")
    # the json stdout callback of some callers would hide the ping result from ``ansible``
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    env.pop("ANSIBLE_LOAD_CALLBACK_PLUGINS", None)
    return env


def plain(obj: dict) -> Any:
    """json object_hook unwrapping ``{"__ansible_unsafe": value}``: ansible-inventory marks strings that
    came from data (the store), not from the inventory file, so that consumers never template them."""
    return obj["__ansible_unsafe"] if set(obj) == {"__ansible_unsafe"} else obj


def list_via_inventory(config_path: Path, env: Optional[dict] = None,
                       inventory: Path = INVENTORY) -> dict:
    """``ansible-inventory -i inventory/cloudvm.yml --list`` for the host config ``config_path``, parsed.

    Raises:
        AssertionError: ansible-inventory failed (its stderr is in the message).
    """
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(inventory), "--list"], cwd=REPO,
                          env=host_env(config_path, env), capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout, object_hook=plain))


def ping_via_inventory(config_path: Path, owner: str, key: Optional[Path] = None, env: Optional[dict] = None,
                       inventory: Path = INVENTORY) -> subprocess.CompletedProcess:
    """``ansible -i inventory/cloudvm.yml owner_<owner> -m ansible.builtin.ping`` (one line per host).

    Args:
        config_path: host configuration of the cloud under test (ZJUSCT_CLOUD_CONFIG).
        owner: whose VMs to ping (group ``owner_<owner>``).
        key: SSH private key authorised in the guest (default: ssh's own default keys).
        env: base environment (default ``os.environ``).
    """
    argv = [str(VENV_BIN / "ansible"), "-i", str(inventory), f"owner_{owner}", "-m", "ansible.builtin.ping",
            "--one-line", "-e", "ansible_ssh_extra_args='-o UserKnownHostsFile=/dev/null -o BatchMode=yes'"]
    if key is not None:
        argv += ["--private-key", str(key)]
    return subprocess.run(argv, cwd=REPO, env=host_env(config_path, env), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)
