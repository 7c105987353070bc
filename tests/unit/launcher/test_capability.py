"""Capabilities (capability.py): a config that asks its VMM for one the VMM's profile lacks is refused by name,
``ConfigInvalid`` naming the field, the value and the types that have it, derived from the profiles."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import capability, config, firecracker, qemu

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "launcher" / "examples"
BASE = {"qemu": "config-qemu-tap.json", "firecracker": "config-firecracker-tap.json"}
RBD = {"pool": "rbd", "image": "alice", "conf": "/etc/ceph/ceph.conf", "user": "cloud"}

# capability -> how a config asks for it
ASKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "tcg": lambda d: d["hypervisor"].update(accel="tcg"),
    "jailer": lambda d: d["hypervisor"].update(jailer={"chrootBaseDir": "/var/lib/zjusct-cloud/jail"},
                                               runAs={"uid": 5000, "gid": 5000}),
    "userNetwork": lambda d: d.update(network={"mode": "user", "hostForwardPort": 2222}),
    "rbd": lambda d: d.update(rootDisk={"rbd": RBD}),
    "directIO": lambda d: d["rootDisk"].update(cache="None"),
    "qcow2": lambda d: d["rootDisk"].update(format="qcow2"),
    "serialConsole": lambda d: d.update(serialConsole={"socketPath": "/run/zjusct-cloud/consoles/default_vm.sock"}),
}
# (type, capability) -> the refusal; every other pair is accepted
REFUSED = {
    ("firecracker", "tcg"): 'hypervisor.accel: "tcg" is not available with firecracker (it needs KVM)',
    ("qemu", "jailer"): "hypervisor.jailer: is only used with hypervisor.type firecracker",
    ("firecracker", "userNetwork"): 'network.mode: "user" is only available with hypervisor.type qemu',
    ("firecracker", "rbd"): "rootDisk.rbd: is only available with hypervisor.type qemu (Firecracker has no librbd)",
    ("firecracker", "directIO"): 'rootDisk.cache: "None" (O_DIRECT) is only available with hypervisor.type qemu',
    ("firecracker", "qcow2"): 'rootDisk.format: "qcow2" is only available with hypervisor.type qemu (Firecracker '
                              "opens raw files only)",
    ("firecracker", "serialConsole"): "serialConsole: is only available with hypervisor.type qemu (its serial console "
                                      "is the VMM's standard input and output, which only the launcher holds)",
}


def asking(vmm_type: str, name: str) -> dict[str, Any]:
    doc = json.loads((EXAMPLES / BASE[vmm_type]).read_text())
    ASKS[name](doc)
    return doc


def problems(doc: dict[str, Any]) -> list[str]:
    try:
        config.parse(doc)
    except config.ConfigError as exc:
        return exc.problems
    return []


def test_every_capability_has_a_way_to_be_asked_and_a_vmm_that_has_it() -> None:
    assert set(ASKS) == set(capability.CAPABILITIES)
    for name in capability.CAPABILITIES:
        assert capability.having(name), f"no VMM type has {name}"
    for vmm_type in capability.VMM_TYPES:
        assert set(capability.profile(vmm_type).lacks) <= set(capability.CAPABILITIES)


@pytest.mark.parametrize("vmm_type", capability.VMM_TYPES)
@pytest.mark.parametrize("name", sorted(ASKS))
def test_a_config_asking_a_vmm_for_a_capability_it_lacks_is_refused_by_name(vmm_type: str, name: str) -> None:
    field = capability.CAPABILITIES[name].field
    found = [p for p in problems(asking(vmm_type, name)) if p.startswith(field + ":")]
    expected = REFUSED.get((vmm_type, name))
    assert found == ([expected] if expected else []), found
    assert (name in capability.profile(vmm_type).lacks) == (expected is not None)


def test_the_refusal_follows_the_profiles_not_the_type_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles in which QEMU lacked O_DIRECT and Firecracker had it: the same config rule refuses QEMU instead."""
    capability.profile("qemu")  # fills the registry
    monkeypatch.setitem(capability._PROFILES, "qemu",
                        dataclasses.replace(qemu.PROFILE, lacks={**qemu.PROFILE.lacks, "directIO": "no O_DIRECT"}))
    fc_lacks = {k: v for k, v in firecracker.PROFILE.lacks.items() if k != "directIO"}
    monkeypatch.setitem(capability._PROFILES, "firecracker", dataclasses.replace(firecracker.PROFILE, lacks=fc_lacks))
    assert capability.having("directIO") == ("firecracker",)
    assert 'rootDisk.cache: "None" (O_DIRECT) is only available with hypervisor.type firecracker (no O_DIRECT)' \
        in problems(asking("qemu", "directIO"))
    assert not [p for p in problems(asking("firecracker", "directIO")) if p.startswith("rootDisk.cache:")]


def test_refusal_of_an_unknown_capability_is_a_launcher_bug() -> None:
    with pytest.raises(capability.UnknownCapability, match="'teleport' is not one of tcg, jailer"):
        capability.refusal("qemu", "teleport")
    with pytest.raises(KeyError, match="xen"):
        capability.profile("xen")


def test_run_refuses_the_config_before_creating_anything(tmp_path: Path) -> None:
    doc = copy.deepcopy(asking("firecracker", "userNetwork"))
    doc.update(runtimeDir=str(tmp_path / "run"), serialLogPath=str(tmp_path / "serial.log"),
               result={"path": str(tmp_path / "result.json")})
    doc.pop("readyMarkerPath", None)
    (tmp_path / "cfg.json").write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "zjusct_launcher", "run", "--config", str(tmp_path / "cfg.json")],
                          env=dict(os.environ, PYTHONPATH=str(REPO / "launcher")), capture_output=True, timeout=60,
                          check=False)
    result = json.loads((tmp_path / "result.json").read_text())
    assert (proc.returncode, result["reason"]) == (2, "ConfigInvalid"), proc.stderr.decode()
    assert 'network.mode: "user" is only available with hypervisor.type qemu' in result["message"]
    assert sorted(os.listdir(tmp_path)) == ["cfg.json", "result.json"], "nothing but the result is written"
