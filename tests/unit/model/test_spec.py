"""CloudVM spec rules (plugins/module_utils/model/spec.py): every limit is named in its message."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    DNS_LABEL_RULE,
    dns_label_problem,
    in_user_terms,
    validate_spec,
    validate_update,
    with_defaults,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def spec(**over):
    return with_defaults({"owner": "alice", "rootVolumeClaim": "alice-root", **over})


def test_defaults_make_a_valid_spec():
    s = spec()
    assert s["vcpus"] == 1 and s["memoryMiB"] == 512 and s["powerState"] == "Stopped" and s["bootID"] == 0
    assert validate_spec(s) == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("vcpus", 0, "spec.vcpus: 0 is below the minimum 1"),
    ("vcpus", 5, "spec.vcpus: 5 is above the maximum 4"),
    ("memoryMiB", 127, "spec.memoryMiB: 127 is below the minimum 128"),
    ("memoryMiB", 8192, "spec.memoryMiB: 8192 is above the maximum 4096"),
    ("powerState", "running", "spec.powerState: 'running' is not one of Running, Stopped"),
    ("owner", "Alice!", "spec.owner: 'Alice!' is not a DNS label"),
    ("bootID", -1, "spec.bootID: -1 is below the minimum 0"),
])
def test_out_of_range_values_are_named(field, value, message):
    errors = validate_spec(spec(**{field: value}))
    assert len(errors) == 1
    assert errors[0].startswith(message)


def test_every_problem_is_listed_at_once():
    errors = validate_spec(spec(vcpus=9, memoryMiB=1, owner="BAD"))
    assert {e.split(":")[0] for e in errors} == {"spec.vcpus", "spec.memoryMiB", "spec.owner"}


def test_ssh_keys_are_checked_one_by_one():
    errors = validate_spec(spec(sshAuthorizedKeys=[KEY, "not a key"]))
    assert errors == ["spec.sshAuthorizedKeys[1]: 'not a key' is not an OpenSSH public key"]


def test_bandwidth_ceiling_must_cover_the_guarantee():
    errors = validate_spec(spec(network={"bandwidth": {"guaranteedMbps": 50, "ceilMbps": 20}}))
    assert errors == ["spec.network.bandwidth.ceilMbps: 20 is below guaranteedMbps 50"]


def test_owner_and_claim_are_immutable_and_boot_id_never_decreases():
    old = spec(bootID=3)
    assert validate_update(old, spec(bootID=4)) == []
    errors = validate_update(old, spec(owner="bob", rootVolumeClaim="x", bootID=2))
    assert [e.split(":")[0] for e in errors] == ["spec.owner", "spec.rootVolumeClaim", "spec.bootID"]


def test_junk_after_a_key_type_is_not_a_key():
    errors = validate_spec(spec(sshAuthorizedKeys=["ssh-ed25519 not base64!"]))
    assert errors and errors[0].startswith("spec.sshAuthorizedKeys[0]")


def test_bandwidth_without_ceiling_is_valid():
    assert validate_spec(spec(network={"bandwidth": {"guaranteedMbps": 0, "priority": 0}})) == []


def test_disk_io_limits_are_checked_and_named_in_user_terms():
    from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import in_user_terms

    assert validate_spec(spec(diskIO={"writeBytesPerSecond": 4194304, "readIOPS": 20})) == []
    errors = validate_spec(spec(diskIO={"writeBytesPerSecond": 1024, "readIOPS": "many", "iops": 1}))
    assert "spec.diskIO.writeBytesPerSecond: 1024 is below the minimum 1048576" in errors
    assert "spec.diskIO.readIOPS: 'many' is not an integer" in errors
    assert any(e.startswith("spec.diskIO.iops: unknown field") for e in errors)
    assert in_user_terms("spec.diskIO.writeIOPS: 5 is below the minimum 20") == (
        "disk_write_iops / disk_io.write_iops (spec.diskIO.writeIOPS; allowed 20 to 10000000 requests/s): 5 is below"
        " the minimum 20")


@pytest.mark.parametrize(("what", "value", "note", "expected"), [
    ("owner", "Alice", "", f"owner: 'Alice' is not a DNS label ({DNS_LABEL_RULE})"),
    ("vm", "x" * 64, "a CloudVM name such as web",
     f"vm: {'x' * 64!r} is not a DNS label ({DNS_LABEL_RULE}); a CloudVM name such as web"),
    ("target_volume", None, "", f"target_volume: None is not a DNS label ({DNS_LABEL_RULE})"),
    ("spec.owner", "Alice", "", "spec.owner: 'Alice' is not a DNS label"),
])
def test_one_dns_label_refusal_names_the_option_the_value_and_the_rule(what, value, note, expected):
    """dns_label_problem is the one message shape; an API field path gets its rule from in_user_terms instead."""
    assert dns_label_problem(what, value, note) == expected
    assert dns_label_problem(what, "web-1", note) is None
    assert in_user_terms(dns_label_problem("spec.owner", "Alice") or "") == \
        f"owner (spec.owner; {DNS_LABEL_RULE}): 'Alice' is not a DNS label"
