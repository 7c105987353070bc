"""Refusals in the user's words: the option / playbook variable typed, the API field, the value and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import check_identity
from ansible_collections.zjusct.cloud.plugins.module_utils.model import spec as _spec
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import in_user_terms, validate_spec, with_defaults

REPO = Path(__file__).resolve().parents[3]


def spec(**over):
    return with_defaults({"owner": "alice", "rootVolumeClaim": "alice-root", **over})


@pytest.mark.parametrize(("over", "expected"), [
    ({"memoryMiB": 4097}, "memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): 4097 is above the maximum 4096"),
    ({"memoryMiB": 127}, "memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): 127 is below the minimum 128"),
    ({"vcpus": 5}, "vcpus (spec.vcpus; allowed 1 to 4): 5 is above the maximum 4"),
    ({"owner": "Alice"}, f"owner (spec.owner; {_spec.DNS_LABEL_RULE}): 'Alice' is not a DNS label"),
    ({"sshAuthorizedKeys": ["nope"]},
     "ssh_public_key / ssh_authorized_keys[0] (spec.sshAuthorizedKeys[0]; OpenSSH public key lines, at most 16):"
     " 'nope' is not an OpenSSH public key"),
    ({"network": {"bandwidth": {"guaranteedMbps": 0, "pool": "P_1"}}},
     f"bandwidth_pool / bandwidth.pool (spec.network.bandwidth.pool; {_spec.DNS_LABEL_RULE}): 'P_1' is not a DNS"
     " label"),
    ({"network": {"bandwidth": {"guaranteedMbps": 50, "ceilMbps": 20}}},
     "ceil_mbps / bandwidth.ceil_mbps (spec.network.bandwidth.ceilMbps; allowed guaranteed_mbps to 100000 Mbit/s):"
     " 20 is below guaranteedMbps 50"),
    ({"network": {"bandwidth": {"guaranteedMbps": 1, "priority": 1001}}},
     "bandwidth_priority / bandwidth.priority (spec.network.bandwidth.priority; allowed 0 to 1000): 1001 is above"
     " the maximum 1000"),
])
def test_spec_errors_name_variable_field_value_and_rule(over, expected):
    errors = validate_spec(spec(**over))
    assert [in_user_terms(e) for e in errors] == [expected]


def test_dns_label_rule_states_rfc_1123_in_full():
    rule = _spec.DNS_LABEL_RULE
    for part in ("RFC 1123", "lower-case letters, digits and '-'", "at most 63", "start and end"):
        assert part in rule


def test_kubernetes_api_messages_are_translated_too():
    api = ('CloudVM.cloud.zjusct.io "vm1" is invalid: spec.memoryMiB: Invalid value: 4097: spec.memoryMiB in'
           ' body should be less than or equal to 4096')
    assert in_user_terms(api) == (
        'CloudVM.cloud.zjusct.io "vm1" is invalid: memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): Invalid'
        ' value: 4097: spec.memoryMiB in body should be less than or equal to 4096')


def test_translation_is_idempotent_and_leaves_unknown_paths():
    once = in_user_terms("spec.vcpus: 0 is below the minimum 1; spec.bootID: must never decrease")
    assert in_user_terms(once) == once
    assert once.endswith("; spec.bootID: must never decrease")
    assert in_user_terms("machine.memoryMiB: 8192 is above the maximum 4096") == \
        "machine.memoryMiB: 8192 is above the maximum 4096"


@pytest.mark.parametrize(("params", "expected"), [
    ({"name": "Bad_Name", "namespace": "default"}, "metadata.name: 'Bad_Name' is not a DNS label"),
    ({"name": "bob", "namespace": "Other"}, "metadata.namespace: 'Other' is not a DNS label"),
    ({"name": "x" * 64, "namespace": "default"}, f"metadata.name: {'x' * 64!r} is not a DNS label"),
])
def test_name_and_namespace_are_checked_before_any_backend(params, expected):
    with pytest.raises(CloudVMError) as caught:
        check_identity(params)
    assert str(caught.value) == expected
    assert in_user_terms(expected).startswith(("name (metadata.name; RFC 1123", "vm_namespace / namespace ("))


def test_playbook_rule_matches_the_spec_module():
    """playbooks/vars/vm_args.yml states the same DNS label rule as model.spec (the playbooks check owner with it)."""
    data = yaml.safe_load((REPO / "playbooks" / "vars" / "vm_args.yml").read_text())
    assert data["vm_dns_label_pattern"] == _spec._DNS_LABEL.pattern
    assert data["vm_dns_label_rule"] == _spec.DNS_LABEL_RULE


def test_playbook_number_rules_match_the_spec_module():
    """Each whole-number playbook variable that sets an API field states that field and its rule as model.spec's
    FIELDS does (tasks/numbers.yml names them in its refusals)."""
    rules = yaml.safe_load((REPO / "playbooks" / "vars" / "vm_args.yml").read_text())["vm_number_rules"]
    by_variable = {typed.split(" / ")[0]: (path, rule) for path, (typed, rule) in _spec.FIELDS.items()}
    checked = 0
    for variable, text in rules.items():
        if text.startswith("spec."):
            path, rule = by_variable[variable]
            assert text == f"{path}; {rule}", variable
            checked += 1
    assert checked == 10
