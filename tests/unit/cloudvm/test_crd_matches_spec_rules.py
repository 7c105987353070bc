"""config/crd/ and plugins/module_utils/model/spec.py state the same limits (the host backend and the API
server must refuse the same specs); this reads the CRD file and compares, so neither drifts alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model import spec as _spec
from zjusct_launcher import config as launcher_config

CRD = Path(__file__).resolve().parents[3] / "config" / "crd" / "cloudvms.cloud.zjusct.io.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        if "type" in node:
            out.append((path, node))
        for key, child in (node.get("properties") or {}).items():
            out.extend(_walk(child, f"{path}.{key}" if path else key))
        if isinstance(node.get("items"), dict):
            out.extend(_walk(node["items"], f"{path}[]"))
    return out


def test_numeric_limits_and_defaults_match(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    bw = spec["network"]["properties"]["bandwidth"]["properties"]
    assert (spec["vcpus"]["minimum"], spec["vcpus"]["maximum"]) == (_spec.VCPUS_MIN, _spec.VCPUS_MAX)
    assert (spec["memoryMiB"]["minimum"], spec["memoryMiB"]["maximum"]) == (_spec.MEMORY_MIB_MIN,
                                                                          _spec.MEMORY_MIB_MAX)
    # the root volume's size: CRD, model and the launcher's rootDisk.sizeMiB take the same range
    assert (spec["rootVolumeSizeMiB"]["minimum"], spec["rootVolumeSizeMiB"]["maximum"]) == (
        _spec.ROOT_VOLUME_SIZE_MIB_MIN, _spec.ROOT_VOLUME_SIZE_MIB_MAX) == launcher_config.ROOT_SIZE_MIB
    assert spec["bootID"]["minimum"] == 0
    assert tuple(spec["powerState"]["enum"]) == _spec.POWER_STATES
    assert {k: spec[k]["default"] for k in _spec.DEFAULTS} == _spec.DEFAULTS
    assert spec["sshAuthorizedKeys"]["maxItems"] == _spec.SSH_KEYS_MAX
    assert spec["sshAuthorizedKeys"]["items"]["maxLength"] == _spec.SSH_KEY_LEN_MAX
    assert bw["guaranteedMbps"]["maximum"] == bw["ceilMbps"]["maximum"] == _spec.BANDWIDTH_MBPS_MAX
    assert (bw["priority"]["minimum"], bw["priority"]["maximum"]) == (_spec.PRIORITY_MIN, _spec.PRIORITY_MAX)
    assert tuple(schema["properties"]["status"]["properties"]["phase"]["enum"]) == _spec.PHASES


def test_disk_io_limits_agree_in_crd_model_and_launcher(schema: dict[str, Any]) -> None:
    """spec.diskIO (CRD), model.disk_io (host backend, modules) and the launcher's rootDisk.ioLimits take the same
    keys and ranges: a limit one accepts, the others accept."""
    crd = schema["properties"]["spec"]["properties"]["diskIO"]["properties"]
    assert tuple(crd) == tuple(_spec.DISK_IO) == tuple(launcher_config.IO_LIMIT_FIELDS)
    for key, (_option, bounds, _unit) in _spec.DISK_IO.items():
        assert (crd[key]["minimum"], crd[key]["maximum"]) == bounds == launcher_config.IO_LIMIT_FIELDS[key]


@pytest.mark.parametrize("key", [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1qBq5mUL3Tj8Yo3Gc0wLkqj0ZC1S4Kk5uGq2pX3cQh alice@laptop",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ==",
    "ssh-ed25519",
    "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
    "ssh-ed25519 AAAA!!",
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY= with a comment",
])
def test_ssh_key_pattern_agrees_with_spec(schema: dict[str, Any], key: str) -> None:
    pattern = schema["properties"]["spec"]["properties"]["sshAuthorizedKeys"]["items"]["pattern"]
    assert bool(re.match(pattern, key)) == _spec.is_ssh_public_key(key)


def test_every_field_is_described_and_every_string_and_list_is_bounded(schema: dict[str, Any]) -> None:
    """kubectl explain reads every field; CEL cost estimation needs maxLength/maxItems everywhere."""
    for path, node in _walk(schema):
        if path in ("", "metadata", "apiVersion", "kind"):  # apiVersion/kind are checked by the server itself
            continue
        assert node.get("description"), f"{path}: no description"
        if node["type"] == "string" and not node.get("enum") and node.get("format") != "date-time":
            assert "maxLength" in node, f"{path}: unbounded string"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path}: unbounded list"


def test_immutable_fields_and_monotonic_boot_id_have_transition_rules(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    for field, rule in (("owner", "self == oldSelf"), ("rootVolumeClaim", "self == oldSelf"),
                        ("bootID", "self >= oldSelf"), ("rootVolumeSizeMiB", "self >= oldSelf")):
        assert [r["rule"] for r in spec[field]["x-kubernetes-validations"]] == [rule]
    # and a set root volume size cannot be removed (model.spec.validate_update says the same)
    rules = [r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert rules == ["!has(oldSelf.rootVolumeSizeMiB) || has(self.rootVolumeSizeMiB)"]


def test_cloudquota_crd_holds_the_dimensions_of_model_quota(schema: dict[str, Any]) -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota

    crd = yaml.safe_load((CRD.parent / f"{quota.CRD_PLURAL}.cloud.zjusct.io.yaml").read_text())
    assert (crd["spec"]["scope"], crd["spec"]["names"]["kind"]) == ("Cluster", quota.CRD_KIND)
    (version,) = crd["spec"]["versions"]
    fields = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(fields) == set(quota.API_FIELDS.values())
    assert all((f["type"], f["minimum"]) == ("integer", 0) for f in fields.values())
    assert quota.ADMITTED_FIELD in schema["properties"]["status"]["properties"]  # the CloudVM status field
