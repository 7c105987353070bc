"""Status derivation (plugins/module_utils/model/phase.py): Running only when alive, current and SSH-ready."""

from __future__ import annotations

import itertools

from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation, derive_status

RUN = {"powerState": "Running", "bootID": 3}
STOP = {"powerState": "Stopped", "bootID": 3}
STATES = ("starting", "alive", "exited", "lost", "unknown")


def test_running_needs_alive_launcher_of_current_boot_and_ssh():
    ready = BootObservation(3, "alive", ready_at="t")
    assert derive_status(RUN, ready).phase == "Running"
    assert derive_status(RUN, BootObservation(3, "alive")).phase == "Pending"


def test_never_running_on_any_other_observation():
    """Exhaustive: Running only for (alive, current boot, ready) under powerState Running."""
    for state, boot, ready, spec in itertools.product(STATES, (2, 3), (None, "t"), (RUN, STOP)):
        obs = BootObservation(boot, state, ready_at=ready, result={"reason": "GuestShutdown"})
        phase = derive_status(spec, obs).phase
        expect_running = state == "alive" and boot == 3 and ready and spec is RUN
        assert (phase == "Running") == bool(expect_running), (state, boot, ready, spec, phase)


def test_case_L2_lost_launcher_is_not_running():
    status = derive_status(RUN, BootObservation(3, "lost", ready_at="t", detail="pid 42 gone"))
    assert status.phase == "Failed" and status.reason == "LauncherLost"


def test_case_L1_unobservable_node_is_unknown_with_node_named():
    status = derive_status(RUN, BootObservation(3, "unknown", node="node-a", detail="node node-a not ready"))
    assert (status.phase, status.reason, status.node) == ("Unknown", "NodeLost", "node-a")


def test_case_L3_new_boot_waits_for_old_launcher():
    old = BootObservation(2, "alive", node="h")
    status = derive_status(RUN, None, others=(old,))
    assert status.phase == "Blocked" and status.reason == "PreviousBootRunning" and "boot 2" in status.message


def test_case_V2_other_writer_blocks_start():
    status = derive_status(RUN, None, volume_writer="client.4123 at 127.0.0.1")
    assert status.phase == "Blocked" and status.reason == "VolumeInUse" and "client.4123" in status.message


def test_results_map_to_stopped_or_failed():
    for reason, phase in (("GuestShutdown", "Stopped"), ("StopRequested", "Stopped"),
                          ("StopTimeoutKilled", "Stopped"), ("GuestReboot", "Stopped"),
                          ("HypervisorCrashed", "Failed"), ("GuestPanic", "Failed"), ("ConfigInvalid", "Failed")):
        status = derive_status(STOP, BootObservation(3, "exited", result={"reason": reason, "exitCode": 0}))
        assert (status.phase, status.reason) == (phase, reason)
        assert status.exit_result["reason"] == reason


def test_stop_requested_while_alive_is_stopping():
    assert derive_status(STOP, BootObservation(3, "alive", ready_at="t")).phase == "Stopping"
