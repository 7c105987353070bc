"""Start/stop planning (plugins/module_utils/model/lifecycle.py): one start request is one boot."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    CloudVMError,
    authorize,
    current_boot_live,
    keys_change,
    params_to_spec,
    plan_power,
    size_change,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    DNS_LABEL_RULE,
    in_user_terms,
    validate_spec,
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


def test_anti_affinity_group_is_set_kept_removed_by_empty_and_checked_in_user_terms():
    grouped = params_to_spec({"name": "a", "owner": "a", "anti_affinity_group": "web"}, None)
    assert grouped["antiAffinityGroup"] == "web"
    assert params_to_spec({"name": "a", "vcpus": 2}, grouped)["antiAffinityGroup"] == "web"
    assert "antiAffinityGroup" not in params_to_spec({"name": "a", "anti_affinity_group": ""}, grouped)
    (problem,) = validate_spec(params_to_spec({"name": "a", "owner": "a", "anti_affinity_group": "Web_1"}, None))
    assert in_user_terms(problem) == ("anti_affinity_group (spec.antiAffinityGroup; " + DNS_LABEL_RULE
                                      + "; empty removes it): 'Web_1' is not a DNS label")
    # a change while a boot of the old group runs takes effect at the next boot, and says so
    up = dict(grouped, powerState="Running", bootID=1)
    warning = size_change(up, dict(up, antiAffinityGroup="db"), 1, {"phase": "Running", "bootID": 1})
    assert warning is not None and "spec.antiAffinityGroup web -> db" in warning and "keeps its node" in warning


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


# One rule decides whether "power_state: running" requests a new boot: model.lifecycle.current_boot_live (plan_power).
# model.phase.needs_new_boot was a second copy that disagreed with it on each case above "agreed cases" (it read the
# status only, not spec.powerState or spec.bootID); the table pins the rule so a second copy cannot come back.
@pytest.mark.parametrize("spec, status, new_boot", [
    # never started: boot 1 is requested (the copy said no new boot for reason NeverStarted)
    (dict(BASE, powerState="Stopped", bootID=0), {"phase": "Stopped", "reason": "NeverStarted", "bootID": 0}, True),
    # no status at all yet, VM stopped: a start requests a boot (the copy said no for a missing status)
    (dict(BASE, powerState="Stopped", bootID=3), None, True),
    # stop requested, launcher not gone yet (status still Running for boot 3): a start after the stop is a new
    # boot, else the stop wins and the VM ends up stopped (the copy said no: it ignored spec.powerState)
    (dict(BASE, powerState="Stopped", bootID=3), {"phase": "Running", "bootID": 3}, True),
    # running and the guest is shutting itself down: the current boot is still live, no second boot while its
    # launcher lives (the copy said yes for Stopping)
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Stopping", "bootID": 3}, False),
    # the status has not caught up with the requested boot 4 (still describes the ended boot 3): boot 4 is live
    # (the copy said yes: it saw Stopped and did not compare bootIDs)
    (dict(BASE, powerState="Running", bootID=4), {"phase": "Stopped", "reason": "GuestShutdown", "bootID": 3}, False),
    (dict(BASE, powerState="Running", bootID=4), {"phase": "Failed", "bootID": 3}, False),
    # agreed cases
    (dict(BASE, powerState="Stopped", bootID=3), {"phase": "Stopping", "reason": "StopRequested", "bootID": 3}, True),
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Failed", "bootID": 3}, True),
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Pending", "bootID": 3}, False),
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Blocked", "bootID": 3}, False),
    # the launcher's node is lost: boot 3 can never be seen Running again, a start asks for boot 4 (the controller
    # starts it once boot 3 is fenced or gone); a second start while boot 4 waits asks for nothing more
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Unknown", "reason": "NodeLost", "bootID": 3}, True),
    (dict(BASE, powerState="Stopped", bootID=3), {"phase": "Unknown", "reason": "NodeLost", "bootID": 3}, True),
    (dict(BASE, powerState="Running", bootID=4), {"phase": "Unknown", "reason": "NodeLost", "bootID": 3}, False),
    (dict(BASE, powerState="Running", bootID=4), {"phase": "Blocked", "reason": "PreviousBootRunning", "bootID": 4},
     False),
    # an observation that failed for another reason is not a lost node: no new boot
    (dict(BASE, powerState="Running", bootID=3), {"phase": "Unknown", "reason": "ObservationFailed", "bootID": 3},
     False),
])
def test_one_rule_decides_whether_a_start_requests_a_new_boot(spec, status, new_boot):
    assert current_boot_live(spec, status) is not new_boot
    out = plan_power(spec, status, "running")
    assert out["powerState"] == "Running"
    assert out["bootID"] == spec["bootID"] + (1 if new_boot else 0)



OLD_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld0000000000000000000000000000000000000000 old"
NEW_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew0000000000000000000000000000000000000000 new"


def _rekeyed(spec: dict) -> dict:
    return dict(spec, sshAuthorizedKeys=[NEW_KEY])


def test_rekeying_a_running_boot_takes_effect_at_the_next_boot_with_a_warning():
    before = dict(BASE, powerState="Running", bootID=3, sshAuthorizedKeys=[OLD_KEY])
    boot, warning = keys_change(before, _rekeyed(before), 3, {"phase": "Running", "bootID": 3}, gateway=True)
    assert boot == 4
    assert warning is not None and warning.startswith(
        "spec.sshAuthorizedKeys change takes effect at the next boot (bootID 4): boot 3 keeps its keys in the guest"
        " and on the host's SSH gateway until it ends")
    assert "restart: true, playbook vm_restart" in warning
    _, k8s_warning = keys_change(before, _rekeyed(before), 3, {"phase": "Running", "bootID": 3})
    assert k8s_warning is not None and "gateway" not in k8s_warning


def test_rekeying_with_a_restart_or_while_off_warns_of_nothing():
    before = dict(BASE, powerState="Running", bootID=3, sshAuthorizedKeys=[OLD_KEY])
    restarted = dict(_rekeyed(before), bootID=4)
    assert keys_change(before, restarted, 3, {"phase": "Running", "bootID": 4}) == (4, None)
    stopped = dict(BASE, powerState="Stopped", bootID=3, sshAuthorizedKeys=[OLD_KEY])
    assert keys_change(stopped, _rekeyed(stopped), 3, {"phase": "Stopped", "bootID": 3}) == (4, None)
    never = dict(BASE, powerState="Stopped", bootID=0)
    assert keys_change(never, _rekeyed(never), None, {}) == (1, None)


def test_a_requested_boot_not_launched_yet_gets_the_new_keys():
    before = dict(BASE, powerState="Running", bootID=5, sshAuthorizedKeys=[OLD_KEY])
    assert keys_change(before, _rekeyed(before), 4, {"phase": "Stopped", "bootID": 4}) == (5, None)


def test_no_key_change_or_a_create_is_no_notice():
    before = dict(BASE, powerState="Running", bootID=3, sshAuthorizedKeys=[OLD_KEY])
    assert keys_change(before, dict(before, vcpus=2), 3, {"phase": "Running", "bootID": 3}) is None
    assert keys_change(None, before, None, {}) is None
