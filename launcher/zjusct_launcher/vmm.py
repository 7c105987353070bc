"""The VMM seam: what the Runner needs from a hypervisor (the :class:`Vmm` Protocol), and the registry of VMMs.

The Runner (:mod:`runner`) does the hypervisor-independent run: the config, the runtimeDir and its lock, the boot
slot, the config disk, the serial log, the TAP, the VMM process (its own session, PR_SET_PDEATHSIG, the watchdog,
the pidfd, the stderr relay), readiness, stop signals, the stop deadline and its repeats, the reason and the
result. Everything that differs per hypervisor is one :class:`Vmm` per run, made by :func:`for_config` from the
adapter registered for ``hypervisor.type`` (one file each, as ``storage/driver.py`` keeps volume drivers):

* ``qemu`` (:mod:`vmm_qemu`): KVM probe with the guest's kernel and the TCG fallback, ``rbd.secret``, the command
  line of :mod:`qemu`, QMP (events, ``system_powerdown``).
* ``firecracker`` (:mod:`vmm_firecracker`): KVM only, ``firecracker.json``, the jailer's chroot, the command lines
  of :mod:`firecracker`, the console on stdout, ``SendCtrlAltDel`` on the API socket (:mod:`firecracker_api`).

The Runner calls a Vmm in this order (each method below says what it does and raises)::

    resolve -> decide_accel -> [boot slot, config disk] -> prepare_files -> [serial log, TAP] -> prepare_sandbox
    -> command -> [VMM started] -> attach -> [loop: event_fds, poll_events, request_stop] -> [VMM reaped] -> cleanup

What a VMM type is before any run (``hypervisor.type``, default binary, kernel format, the capabilities it lacks)
is its pure :class:`capability.Profile`; an adapter's ``profile`` is that object. A capability the run performs
is one method per VMM (``Capability.method``): the VMMs that have it implement it, the others list it in their
profile's ``lacks`` (the config is then refused, ``ConfigInvalid`` naming the field) and leave it out;
:func:`conformance_problems` checks both, :func:`capability_method` is how the Runner reaches one.

Adding a VMM: ``vmm_<type>.py`` with a class that satisfies :class:`Vmm` and takes ``(cfg, paths)``, its
registration in :func:`_register`, its pure builder module with the ``PROFILE`` (:mod:`capability`), the type in
the JSON Schema, and the host config's ``hypervisor`` choices (docs/architecture.md, "Where to add").
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from zjusct_launcher import log
from zjusct_launcher.capability import CAPABILITIES, Profile
from zjusct_launcher.config import LauncherConfig
from zjusct_launcher.kvm import KvmVerdict
from zjusct_launcher.paths import RuntimePaths


class RunFailed(Exception):
    """Ends the run early with a result reason (``HypervisorMissing``, ``LauncherError``) and its message."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class StopRetry(Exception):
    """The VMM cannot take a graceful stop request yet (Firecracker's API socket bound, not listening): not an
    attempt; ask again in ``seconds``."""

    def __init__(self, seconds: float):
        super().__init__(f"ask again in {seconds} s")
        self.seconds = seconds


class StopUnavailable(Exception):
    """The VMM has no way to take a graceful stop request in this run (QEMU without QMP); the message is the
    warning logged at the first attempt. The stop timeout then ends in a kill."""


class StopFailed(Exception):
    """A graceful stop request failed (the message is the error, as logged)."""


class CapabilityMissing(Exception):
    """A VMM was asked to perform a capability its profile lacks or that its adapter does not implement (a launcher
    bug: ``config.parse`` refuses such a config first). The message names the capability and the VMM type."""


@dataclass
class Observed:
    """What the VMM's own events said during the run (QEMU's QMP; Firecracker has none), read by the Runner for the
    stop loop and for :class:`decide.Facts`.

    Attributes:
        shutdown_reason: QEMU's SHUTDOWN event ``data.reason`` (``guest-shutdown``, ``guest-reset``, ...), or None.
        guest_panicked: a GUEST_PANICKED event was seen.
    """

    shutdown_reason: str | None = None
    guest_panicked: bool = False


class Vmm(Protocol):
    """One hypervisor for one run (made by :func:`for_config`; it keeps what it set up until :meth:`cleanup`).

    Every method runs in the launcher's main thread. Failures that end the run raise :class:`RunFailed`; any other
    exception is a launcher bug (the Runner reports it as ``LauncherError``).
    """

    profile: Profile
    """The VMM type's pure profile (:mod:`capability`)."""
    observed: Observed
    """Updated by :meth:`poll_events`."""
    console_on_stdout: bool
    """True: the guest console is the VMM's stdout, which the Runner appends to ``serialLogPath``; False: the VMM
    writes ``serialLogPath`` itself and its stdout is /dev/null."""

    def resolve(self) -> str:
        """Find the executables this run needs (``hypervisor.binary`` or the profile's default in PATH; Firecracker
        also its jailer). Returns the VMM binary's path.

        Raises:
            RunFailed: ``HypervisorMissing``, naming the config field (``hypervisor.binary: ...``).
        """

    def decide_accel(self, binary: str) -> str:
        """The accelerator of this run, ``"kvm"`` or ``"tcg"`` (never ``auto``), with the bounded KVM probe when one
        is needed (logged as ``kvm probe``; docs/launcher-protocol.md §3).

        Raises:
            RunFailed: ``HypervisorMissing`` when KVM is needed but unusable.
        """

    def prepare_files(self) -> None:
        """Write the files the VMM reads from runtimeDir, after the config disk and before the TAP (QEMU:
        ``rbd.secret``, 0600; Firecracker without jailer: ``firecracker.json``).

        Raises:
            RunFailed: ``LauncherError`` naming the config field (``rootDisk.rbd.keyringPath ...``).
        """

    def prepare_sandbox(self, binary: str) -> None:
        """After the TAP, before the start: lay out what the VMM's privilege drop needs outside its command line
        (Firecracker's jailer: the chroot; QEMU drops privileges itself, ``-runas``: nothing).

        Raises:
            RunFailed: ``LauncherError`` naming the config field (``hypervisor.jailer.chrootBaseDir: ...``).
        """

    def command(self, binary: str, accel: str) -> list[str]:
        """The VMM's argv for this run (logged whole in ``vmm started``; never a secret on it)."""

    def attach(self, alive: Callable[[], bool]) -> None:
        """Right after the VMM started: connect to its control channel (QEMU: QMP, waiting while ``alive()``). A
        channel that cannot be reached is logged and left out; it does not end the run."""

    def event_fds(self) -> list[int]:
        """File descriptors the Runner's select() waits on for this VMM's events (empty when it has none)."""

    def poll_events(self) -> None:
        """Read the events that arrived without blocking, log them and update :attr:`observed`."""

    def request_stop(self) -> str:
        """Ask the guest to shut down once (QMP ``system_powerdown``; Firecracker ``SendCtrlAltDel``). Returns the
        method's name as logged in ``graceful stop sent``.

        Raises:
            StopRetry: the VMM cannot take it yet; not an attempt.
            StopUnavailable: no way to ask in this run.
            StopFailed: the request failed.
        """

    def cleanup(self) -> None:
        """After the VMM is reaped: undo what this Vmm set up (close QMP; remove the jail, give the root disk its
        owner back). Never raises for a cleanup failure: it is logged."""


def find_executable(explicit: str | None, default: str, field: str) -> str:
    """``explicit`` when it is an executable file, else ``default`` found in PATH.

    Args:
        explicit: the config's absolute path (``hypervisor.binary``), or None.
        default: the executable's name looked up in PATH when ``explicit`` is None.
        field: the config field of ``explicit``, named in the messages.

    Raises:
        RunFailed: ``HypervisorMissing``: ``<field>: <explicit> is not an executable file``, or ``<default> not
            found in PATH (<PATH>); install it or set <field>``.
    """
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise RunFailed("HypervisorMissing", f"{field}: {explicit} is not an executable file")
    found = shutil.which(default)
    if not found:
        raise RunFailed("HypervisorMissing", f"{default} not found in PATH ({os.environ.get('PATH', '')}); "
                                             f"install it or set {field}")
    return found


def log_kvm_verdict(verdict: KvmVerdict) -> None:
    """The ``kvm probe`` log line (usable, detail, seconds) every VMM writes for its KVM decision."""
    log.info("kvm probe", usable=verdict.usable, detail=verdict.detail, seconds=round(verdict.seconds, 3))


VmmFactory = Callable[[LauncherConfig, RuntimePaths], Vmm]

VMMS: dict[str, VmmFactory] = {}
"""``hypervisor.type`` -> the adapter class (called with ``(cfg, paths)``; filled on first use by
:func:`for_config`: the adapters import this module, so they are imported here only when a VMM is asked for)."""


def _register() -> None:
    from zjusct_launcher.vmm_firecracker import FirecrackerVmm
    from zjusct_launcher.vmm_qemu import QemuVmm

    qemu_vmm: VmmFactory = QemuVmm  # typed: mypy holds each adapter to the Vmm Protocol here
    firecracker_vmm: VmmFactory = FirecrackerVmm
    VMMS.update({QemuVmm.profile.type: qemu_vmm, FirecrackerVmm.profile.type: firecracker_vmm})


def registered() -> dict[str, VmmFactory]:
    """The registry (``hypervisor.type`` -> adapter class), filled."""
    if not VMMS:
        _register()
    return VMMS


def for_config(cfg: LauncherConfig, paths: RuntimePaths) -> Vmm:
    """The VMM of ``cfg.hypervisor.type`` for one run.

    Raises:
        KeyError: a type without an adapter (``config.parse`` accepts only the types of ``capability.VMM_TYPES``,
            which ``tests/unit/launcher/test_vmm.py`` holds equal to the registry).
    """
    factory: VmmFactory = registered()[cfg.hypervisor.type]
    return factory(cfg, paths)


def capability_method(vmm: Vmm, name: str) -> Callable[..., Any]:
    """The bound method of ``vmm`` that performs capability ``name`` during the run (``Capability.method``).

    Raises:
        CapabilityMissing: ``<type> lacks capability <name>``: its profile lacks it or its adapter has no such
            method (the config refusal comes first; this is the backstop that keeps a lack from being a no-op).
        ValueError: ``name`` is no capability, or one without a method.
    """
    cap = CAPABILITIES.get(name)
    if cap is None or cap.method is None:
        raise ValueError(f"capability {name!r} is not a capability with a method")
    method = getattr(vmm, cap.method, None)
    if name in vmm.profile.lacks or not callable(method):
        raise CapabilityMissing(f"{vmm.profile.type} lacks capability {name} (method {cap.method})")
    return method


PROTOCOL_METHODS = ("resolve", "decide_accel", "prepare_files", "prepare_sandbox", "command", "attach",
                    "event_fds", "poll_events", "request_stop", "cleanup")
"""The :class:`Vmm` methods every adapter implements."""


def conformance_problems(adapter: type) -> list[str]:
    """What keeps ``adapter`` (a VMM class) from being a registrable :class:`Vmm`, one sentence each (empty: none).

    Checked: a :class:`capability.Profile` in ``profile``; every Protocol method and ``console_on_stdout``; every
    name in ``profile.lacks`` is a capability of :data:`capability.CAPABILITIES`; for every capability with a
    method, the adapter implements the method exactly when its profile does not lack the capability (a lacking
    VMM says so by name, never with a method that does nothing).
    """
    name = getattr(adapter, "__name__", repr(adapter))
    prof = getattr(adapter, "profile", None)
    if not isinstance(prof, Profile):
        return [f"{name}: profile is not a capability.Profile"]
    problems = [f"{name}: no method {m}" for m in PROTOCOL_METHODS if not callable(getattr(adapter, m, None))]
    if not isinstance(getattr(adapter, "console_on_stdout", None), bool):
        problems.append(f"{name}: console_on_stdout is not a bool")
    problems += [f"{name}: profile.lacks names {c!r}, which is not a capability" for c in prof.lacks
                 if c not in CAPABILITIES]
    for cap in CAPABILITIES.values():
        if cap.method is None:
            continue
        has = callable(getattr(adapter, cap.method, None))
        if cap.name in prof.lacks and has:
            problems.append(f"{name}: lacks {cap.name} but defines {cap.method}")
        elif cap.name not in prof.lacks and not has:
            problems.append(f"{name}: has {cap.name} (not in profile.lacks) but no method {cap.method}")
    return problems
