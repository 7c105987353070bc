"""Why did the run end? A pure decision over the facts the runner observed.

Order of precedence (docs/launcher-protocol.md "Reasons"):
1. the launcher killed the VMM after the stop timeout -> StopTimeoutKilled (or ReadinessTimeout when the stop was
   caused by the readiness timeout);
2. readiness timed out and the guest then stopped -> ReadinessTimeout;
3. the guest panicked (GUEST_PANICKED / SHUTDOWN guest-panic / a "Kernel panic" line on the serial console of
   this boot) -> GuestPanic;
4. the VMM died of a signal the launcher did not send, or exited non-zero -> HypervisorCrashed;
5. a stop was requested and the VMM exited 0 -> StopRequested;
6. QEMU's SHUTDOWN reason: guest-reset -> GuestReboot, guest-shutdown -> GuestShutdown; a host-side reason the
   launcher did not cause (host-signal, host-qmp-quit by someone else) -> HypervisorCrashed;
7. Firecracker exited 0 unasked -> GuestReboot (it exits only on a guest reset; a guest poweroff halts it);
8. QEMU exited 0 without any SHUTDOWN event (QMP unavailable) -> GuestShutdown, saying the reason is inferred.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Facts:
    hypervisor: str  # "qemu" | "firecracker"
    returncode: int  # Popen.returncode: >= 0 exit status, < 0 killed by signal -returncode
    stop_requested: bool = False
    readiness_timed_out: bool = False
    killed_after_timeout: bool = False
    shutdown_reason: str | None = None  # QEMU SHUTDOWN event data.reason
    guest_panicked: bool = False
    serial_panic: bool = False


def exit_status(returncode: int) -> int:
    """Shell convention for the result's hypervisorExitStatus: exit status, or 128 + signal number."""
    return returncode if returncode >= 0 else 128 - returncode


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


def decide(f: Facts, stop_timeout_seconds: int) -> tuple[str, str]:
    """Return (reason, message) for the result document."""
    how = f"{f.hypervisor} {_how(f.returncode)}"
    if f.killed_after_timeout:
        if f.readiness_timed_out:
            return "ReadinessTimeout", (f"no SSH banner in time; the guest ignored the graceful stop for "
                                        f"{stop_timeout_seconds} s and was killed ({how})")
        return "StopTimeoutKilled", (f"the guest did not shut down within stopTimeoutSeconds={stop_timeout_seconds}"
                                     f" after the graceful stop; the launcher killed it ({how})")
    if f.readiness_timed_out:
        return "ReadinessTimeout", f"no SSH banner within readiness.timeoutSeconds; the guest was stopped ({how})"
    if f.guest_panicked or f.shutdown_reason == "guest-panic" or f.serial_panic:
        source = "pvpanic GUEST_PANICKED event" if (f.guest_panicked or f.shutdown_reason == "guest-panic") \
            else "'Kernel panic' on the serial console"
        return "GuestPanic", f"the guest kernel panicked ({source}); {how}"
    if f.returncode != 0:
        extra = ""
        if f.hypervisor == "firecracker" and f.returncode > 0:
            from zjusct_launcher.firecracker import describe_exit

            extra = f" ({describe_exit(f.returncode)})"
        return "HypervisorCrashed", f"{how}{extra} without a request from the launcher"
    if f.stop_requested:
        return "StopRequested", f"stopped on request: the guest shut down after the graceful stop; {how}"
    if f.hypervisor == "qemu":
        if f.shutdown_reason == "guest-reset":
            return "GuestReboot", f"the guest rebooted (QEMU runs with -no-reboot, so the run ends); {how}"
        if f.shutdown_reason == "guest-shutdown":
            return "GuestShutdown", f"the guest powered off; {how}"
        if f.shutdown_reason is not None:
            return "HypervisorCrashed", f"QEMU shut down for a host reason the launcher did not cause " \
                                        f"({f.shutdown_reason}); {how}"
        return "GuestShutdown", f"{how} with no SHUTDOWN event seen (QMP unavailable); assumed guest poweroff"
    return "GuestReboot", f"{how}: Firecracker exits when the guest resets (reboot or Ctrl-Alt-Del)"
