"""Start/stop planning (plugins/module_utils/_lifecycle.py): one start request is one boot."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils._lifecycle import (
    CloudVMError,
    authorize,
    params_to_spec,
    plan_power,
)

BASE = {"owner": "alice", "rootVolumeClaim": "alice-root", "vcpus": 1, "memoryMiB": 512}


def test_start_of_a_never_started_vm_requests_boot_1():
    out = plan_power(dict(BASE, powerState="Stopped", bootID=0), {}, "running")
    assert out["powerState"] == "Running" and out["bootID"] == 1


def test_start_on_running_vm_changes_nothing():
    spec = dict(BASE, powerState="Running", bootID=4)
    assert plan_power(spec, {"phase": "Running", "bootID": 4}, "running") == spec


def test_retried_start_before_the_status_caught_up_does_not_boot_twice():
    spec = dict(BASE, powerState="Running", bootID=5)
    # status still describes the previous boot: the request for boot 5 is in flight
    assert plan_power(spec, {"phase": "Stopped", "bootID": 4}, "running") == spec


def test_start_after_guest_shutdown_bumps_boot_id_once():
    spec = dict(BASE, powerState="Running", bootID=5)
    once = plan_power(spec, {"phase": "Stopped", "reason": "GuestShutdown", "bootID": 5}, "running")
    assert once["bootID"] == 6
    # the same task retried sees the new request in flight
    assert plan_power(once, {"phase": "Stopped", "reason": "GuestShutdown", "bootID": 5}, "running") == once


def test_start_after_failure_retries_with_a_new_boot():
    spec = dict(BASE, powerState="Running", bootID=2)
    assert plan_power(spec, {"phase": "Failed", "bootID": 2}, "running")["bootID"] == 3


def test_stop_keeps_boot_id():
    spec = dict(BASE, powerState="Running", bootID=2)
    out = plan_power(spec, {"phase": "Running", "bootID": 2}, "stopped")
    assert out == dict(spec, powerState="Stopped")


def test_unknown_phase_never_starts_a_second_copy():
    spec = dict(BASE, powerState="Running", bootID=2)
    assert plan_power(spec, {"phase": "Unknown", "bootID": 2}, "running") == spec


def test_params_keep_unset_fields_and_fill_defaults():
    created = params_to_spec({"name": "alice", "owner": "alice"}, None)
    assert created["rootVolumeClaim"] == "alice-root" and created["vcpus"] == 1
    updated = params_to_spec({"name": "alice", "memory_mib": 1024}, dict(created, vcpus=2))
    assert updated["vcpus"] == 2 and updated["memoryMiB"] == 1024


def test_bandwidth_ceiling_defaults_to_the_guarantee_and_is_left_out_without_one():
    shaped = params_to_spec({"name": "a", "owner": "a", "bandwidth": {"guaranteed_mbps": 20}}, None)
    assert shaped["network"]["bandwidth"] == {"guaranteedMbps": 20, "ceilMbps": 20, "priority": 0}
    unshaped = params_to_spec({"name": "a", "owner": "a", "bandwidth": {"guaranteed_mbps": 0}}, None)
    assert "ceilMbps" not in unshaped["network"]["bandwidth"]


def test_authorize_refuses_another_owner_and_names_both():
    vm = {"metadata": {"namespace": "default", "name": "bob"}, "spec": dict(BASE, owner="bob")}
    with pytest.raises(CloudVMError, match="owner: 'alice' may not act on CloudVM default/bob, which belongs to"
                                           " owner 'bob'"):
        authorize(vm, {"owner": "alice", "name": "bob", "namespace": "default"})


def test_authorize_lets_the_owner_the_operator_and_creation_through():
    vm = {"metadata": {"namespace": "default", "name": "bob"}, "spec": dict(BASE, owner="bob")}
    authorize(vm, {"owner": "bob"})
    authorize(vm, {"owner": "alice", "operator": True})
    authorize(vm, {"owner": None})  # an operator's own task names no owner
    authorize(None, {"owner": "alice"})  # creating: the owner becomes spec.owner


def test_operator_owner_names_the_owner_of_a_new_vm_only():
    existing = dict(BASE, owner="bob", powerState="Stopped", bootID=0)
    assert params_to_spec({"owner": "ops", "operator": True, "name": "bob"}, existing)["owner"] == "bob"
    assert params_to_spec({"owner": "carol", "operator": True, "name": "c"}, None)["owner"] == "carol"
