# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a CloudVM's status is, given its spec and what is actually there (pure).

The host backend (launcher process + result file) and the Kubernetes controller (launcher Pod +
termination message) both reduce what they observe to a :class:`BootObservation` and call
:func:`derive_status`. The function never trusts a previous status: a status says Running only
while a launcher for the current bootID is known alive *and* the guest's SSH banner answered
(docs/api/cloudvm.md "Phases"; cases L1, L2, L3 of docs/architecture.md "Failure cases").

Phases and reasons (docs/api/cloudvm.md has the table):

=========  ===================================================================================
Pending    boot requested, launcher starting or guest not yet answering SSH (Starting,
           WaitingForSSH)
Running    launcher alive for spec.bootID and SSH banner seen (SSHReady)
Stopping   stop requested (powerState Stopped) while the launcher is still alive (StopRequested)
Stopped    no launcher alive; the last run ended as asked or the guest shut itself down
           (NeverStarted, StopRequested, GuestShutdown, GuestReboot, StopTimeoutKilled)
Failed     the last run ended with a failure (HypervisorCrashed, GuestPanic, ConfigInvalid,
           HypervisorMissing, ReadinessTimeout, LauncherError, LauncherLost)
Blocked    a start is requested but cannot proceed: an older boot's launcher is still alive
           (PreviousBootRunning) or the root volume has another writer (VolumeInUse)
Unknown    the launcher's state cannot be observed (NodeLost, ObservationFailed)
=========  ===================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Launcher result reasons after which the VM is simply off (exit code 0 in launcher protocol v1,
# plus StopTimeoutKilled: the stop was asked for and completed by force).
STOPPED_REASONS = frozenset({"GuestShutdown", "GuestReboot", "StopRequested", "StopTimeoutKilled"})


@dataclass(frozen=True)
class BootObservation:
    """What a backend sees of one boot (one launcher run) of a VM.

    Attributes:
        boot_id: the bootID this launcher was started for.
        state: ``starting`` (started, not yet known alive), ``alive`` (launcher or its VMM holds
            the VM's lock / Pod running), ``exited`` (ended and left a result), ``lost`` (gone
            without a result: killed, Pod deleted), ``unknown`` (cannot be observed, e.g. its
            node stopped reporting).
        ready_at: RFC 3339 time the SSH banner answered, if it did.
        started_at: RFC 3339 time the launcher started.
        result: the LauncherResult document once the run ended (``reason``, ``exitCode``,
            ``finishedAt``, ``message``).
        node: where it runs (host name or Kubernetes node).
        detail: free text for Unknown/lost observations (e.g. "node node-a not ready").
    """

    boot_id: int
    state: str
    ready_at: Optional[str] = None
    started_at: Optional[str] = None
    result: Optional[dict] = None
    node: Optional[str] = None
    detail: str = ""


@dataclass
class Status:
    """The derived ``status`` of a CloudVM (camelCase keys via :meth:`as_dict`)."""

    phase: str
    reason: str
    message: str
    boot_id: int
    node: Optional[str] = None
    started_at: Optional[str] = None
    ssh_ready_at: Optional[str] = None
    exit_result: Optional[dict] = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Return the status as the CRD's camelCase mapping (None values left out)."""
        out = {
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "bootID": self.boot_id,
            "node": self.node,
            "startedAt": self.started_at,
            "sshReadyAt": self.ssh_ready_at,
            "exitResult": self.exit_result,
        }
        out.update(self.extra)
        return {k: v for k, v in out.items() if v is not None}


def _exit_result(result: dict) -> dict:
    return {
        "reason": result.get("reason", "Unknown"),
        "exitCode": result.get("exitCode"),
        "finishedAt": result.get("finishedAt"),
    }


def derive_status(
    spec: dict,
    current: Optional[BootObservation],
    others: tuple[BootObservation, ...] = (),
    volume_writer: Optional[str] = None,
) -> Status:
    """Derive a CloudVM's status from its spec and the observed launchers.

    Args:
        spec: CloudVM spec with defaults (``powerState``, ``bootID``).
        current: the observation of the newest boot known for this VM (any bootID), or None when
            the VM never ran.
        others: observations of older boots that may still be alive (e.g. a Pod still
            terminating, a launcher being stopped). Any that is ``alive``/``starting``/``unknown``
            blocks a new boot (case L3: never two launchers for one VM).
        volume_writer: a description of another writer on the root volume (RBD watcher, other
            VM's claim), which blocks a start (case V2).

    Returns:
        The :class:`Status`. Never Running unless ``current`` is alive, belongs to
        ``spec.bootID`` and has ``ready_at``.
    """
    want_running = spec.get("powerState") == "Running"
    boot_id = int(spec.get("bootID", 0))
    lingering = [o for o in others if o.state in ("alive", "starting", "unknown")]

    if current is not None and current.state == "unknown":
        return Status("Unknown", "NodeLost" if current.node else "ObservationFailed",
                      current.detail or "the launcher's state cannot be observed", current.boot_id,
                      node=current.node, started_at=current.started_at, ssh_ready_at=current.ready_at)

    if current is not None and current.state in ("alive", "starting"):
        if not want_running or current.boot_id != boot_id:
            phase, reason, message = "Stopping", "StopRequested", f"stopping boot {current.boot_id}"
        elif current.ready_at and current.state == "alive":
            phase, reason, message = "Running", "SSHReady", "guest answered SSH"
        else:
            phase = "Pending"
            reason = "WaitingForSSH" if current.state == "alive" else "Starting"
            message = f"boot {boot_id} started, waiting for the SSH banner"
        return Status(phase, reason, message, current.boot_id, node=current.node,
                      started_at=current.started_at, ssh_ready_at=current.ready_at)

    # No launcher of the newest boot is alive.
    if want_running and (current is None or current.boot_id < boot_id):
        if lingering:
            old = lingering[0]
            return Status("Blocked", "PreviousBootRunning",
                          f"boot {old.boot_id} is still {old.state}"
                          + (f" on {old.node}" if old.node else "") + "; waiting until it has exited",
                          boot_id, node=old.node)
        if volume_writer:
            return Status("Blocked", "VolumeInUse", f"root volume has another writer: {volume_writer}", boot_id)
        return Status("Pending", "Starting", f"boot {boot_id} requested", boot_id)

    if current is None:
        return Status("Stopped", "NeverStarted", "the VM has not been started", boot_id)

    if current.state == "lost":
        return Status("Failed", "LauncherLost",
                      current.detail or f"the launcher of boot {current.boot_id} vanished without a result",
                      current.boot_id, node=current.node, started_at=current.started_at)

    result = current.result or {}
    reason = result.get("reason", "LauncherError")
    message = result.get("message") or reason
    exit_result = _exit_result(result)
    phase = "Stopped" if reason in STOPPED_REASONS else "Failed"
    return Status(phase, reason, message, current.boot_id, node=current.node,
                  started_at=current.started_at, ssh_ready_at=current.ready_at, exit_result=exit_result)


def current_and_older(spec: dict, latest: Optional[BootObservation]
                      ) -> tuple[Optional[BootObservation], tuple[BootObservation, ...]]:
    """Split the newest observed boot into :func:`derive_status`'s ``current`` and ``others``.

    While the spec asks Running for a newer bootID, a still alive or starting older boot is not the current one
    but another that blocks the new boot (case L3 in docs/architecture.md); otherwise it is the current one.
    """
    if latest is not None and spec["powerState"] == "Running" and latest.boot_id < int(spec["bootID"]) and \
            latest.state in ("alive", "starting"):
        return None, (latest,)
    return latest, ()
