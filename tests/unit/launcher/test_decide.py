"""Reason decision table (pure)."""

from __future__ import annotations

import pytest
from zjusct_launcher.decide import Facts, decide, exit_status

CASES = [
    (Facts("qemu", 0, stop_requested=True, shutdown_reason="guest-shutdown"), "StopRequested"),
    (Facts("qemu", 0, shutdown_reason="guest-shutdown"), "GuestShutdown"),
    (Facts("qemu", 0, shutdown_reason="guest-reset"), "GuestReboot"),
    (Facts("qemu", 0, shutdown_reason="guest-panic", guest_panicked=True), "GuestPanic"),
    (Facts("qemu", 0, shutdown_reason="guest-reset", serial_panic=True), "GuestPanic"),
    (Facts("qemu", -9), "HypervisorCrashed"),
    (Facts("qemu", 1), "HypervisorCrashed"),
    (Facts("qemu", 0, shutdown_reason="host-signal"), "HypervisorCrashed"),
    (Facts("qemu", -9, stop_requested=True, killed_after_timeout=True), "StopTimeoutKilled"),
    (Facts("qemu", 0, readiness_timed_out=True, shutdown_reason="guest-shutdown"), "ReadinessTimeout"),
    (Facts("qemu", -9, readiness_timed_out=True, killed_after_timeout=True), "ReadinessTimeout"),
    (Facts("qemu", 0), "GuestShutdown"),
    (Facts("firecracker", 0, stop_requested=True), "StopRequested"),
    (Facts("firecracker", 0), "GuestReboot"),
    (Facts("firecracker", 148), "HypervisorCrashed"),
    (Facts("firecracker", -9, stop_requested=True, killed_after_timeout=True), "StopTimeoutKilled"),
]


@pytest.mark.parametrize(("facts", "reason"), CASES)
def test_reason(facts: Facts, reason: str) -> None:
    got, message = decide(facts, 30)
    assert got == reason, message
    assert message


def test_firecracker_exit_code_is_explained() -> None:
    assert "bad syscall" in decide(Facts("firecracker", 148), 30)[1]


def test_exit_status_uses_128_plus_signal() -> None:
    assert (exit_status(0), exit_status(3), exit_status(-9)) == (0, 3, 137)
