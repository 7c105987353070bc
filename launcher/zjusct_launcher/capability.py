"""What a VMM can do, by name: the capability table and each VMM type's static profile (pure).

A **capability** is something a LauncherConfig may ask of its VMM (:data:`CAPABILITIES`): TCG, the jailer, the
user-mode network, an RBD root disk, O_DIRECT, a qcow2 root disk, the serial console socket. Every VMM type has a
:class:`Profile` in its own pure builder module (``qemu.PROFILE``, ``firecracker.PROFILE``): its
``hypervisor.type`` name, its default binary, what its kernel must look like, and the capabilities it **lacks**, each
by name with the reason. A config that asks a VMM for a capability its profile lacks is refused by :func:`refusal`
while it is parsed (``config.parse``, ``ConfigInvalid``), naming the config field, the value and the types that
have it::

    network.mode: "user" is only available with hypervisor.type qemu

A capability that needs an action of the VMM during the run (a serial console socket, an incoming live migration,
resume from saved state, a QMP block/throttle change) also names a method of the :class:`vmm.Vmm` Protocol
(``Capability.method``): a VMM that has it implements that method, one that lacks it lists the capability in its
``Profile.lacks`` and does not implement it (``vmm.conformance_problems`` holds every adapter to this, and the
config refusal ensures the method is never called on a VMM that lacks it). Adding such a capability: a row here,
the config field in ``config.py`` that asks for it (one :func:`refusal` call where it is parsed), the method on
the Protocol, and per VMM either the method or the name in ``lacks``.

Adding a VMM type: a pure builder module with its ``PROFILE`` (registered in :data:`VMM_TYPES` and
:func:`profile`), an adapter ``vmm_<type>.py`` registered in ``vmm.VMMS`` (docs/architecture.md, "The launcher,
room by room").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

VMM_TYPES = ("qemu", "firecracker")
"""The ``hypervisor.type`` values, in the order error messages list them (the keys of :func:`profile`)."""


@dataclass(frozen=True)
class Capability:
    """One thing a config may ask of its VMM.

    Attributes:
        name: the capability's name (what a ``Profile.lacks`` key says).
        field: the LauncherConfig field that asks for it (the refusal names it).
        refusal: the refusal message after ``<field>: ``, a format string over ``value`` (the value typed, shown
            as in every config problem, and a trailing space when there is one), ``vmm`` (the asking config's
            hypervisor.type), ``having`` (the types that have the capability, joined by " or ") and ``why``
            (`` (<the lacking profile's reason>)`` or empty).
        method: the :class:`vmm.Vmm` method that performs it during the run, or None when the VMM's command line
            or files carry it.
    """

    name: str
    field: str
    refusal: str = "{value}is not available with hypervisor.type {vmm}{why}"
    method: str | None = None


CAPABILITIES: Mapping[str, Capability] = {c.name: c for c in (
    Capability("tcg", "hypervisor.accel", "{value}is not available with {vmm}{why}"),
    Capability("jailer", "hypervisor.jailer", "{value}is only used with hypervisor.type {having}{why}"),
    Capability("userNetwork", "network.mode", "{value}is only available with hypervisor.type {having}{why}"),
    Capability("rbd", "rootDisk.rbd", "{value}is only available with hypervisor.type {having}{why}"),
    Capability("directIO", "rootDisk.cache", "{value}(O_DIRECT) is only available with hypervisor.type {having}{why}"),
    Capability("qcow2", "rootDisk.format", "{value}is only available with hypervisor.type {having}{why}"),
    Capability("serialConsole", "serialConsole", "{value}is only available with hypervisor.type {having}{why}",
               method="open_serial_console"),
)}
"""Capability name -> :class:`Capability`; the config asks for them where it parses their fields."""


@dataclass(frozen=True)
class Profile:
    """What is fixed about one VMM type, before any run.

    Attributes:
        type: the ``hypervisor.type`` value.
        default_binary: the executable looked up in PATH when ``hypervisor.binary`` is null.
        lacks: capability name -> the reason the VMM lacks it (shown in parentheses; "" for none).
        kernel_magic: the first bytes ``boot.kernel`` must start with, or None for any kernel the VMM boots.
        kernel_refusal: the problem after ``boot.kernel: '<path>' `` when the magic is missing.
    """

    type: str
    default_binary: str
    lacks: Mapping[str, str] = field(default_factory=dict)
    kernel_magic: bytes | None = None
    kernel_refusal: str = ""


_PROFILES: dict[str, Profile] = {}


class UnknownCapability(ValueError):
    """A profile or a caller named a capability that :data:`CAPABILITIES` does not have (a launcher bug)."""


def profile(vmm_type: str) -> Profile:
    """The profile of ``vmm_type`` (one of :data:`VMM_TYPES`).

    Raises:
        KeyError: naming the type, for a type that is not registered (``config.parse`` refuses those first).
    """
    if not _PROFILES:
        # the builder modules import config, which imports this module: they are imported when first asked for
        from zjusct_launcher import firecracker, qemu

        _PROFILES.update({p.type: p for p in (qemu.PROFILE, firecracker.PROFILE)})
    return _PROFILES[vmm_type]


def having(capability: str) -> tuple[str, ...]:
    """The VMM types whose profile does not lack ``capability``, in :data:`VMM_TYPES` order."""
    return tuple(t for t in VMM_TYPES if capability not in profile(t).lacks)


def refusal(vmm_type: str, capability: str, value: str = "") -> tuple[str, str] | None:
    """Whether a config of ``vmm_type`` may ask for ``capability``.

    Args:
        vmm_type: the config's ``hypervisor.type``.
        capability: a key of :data:`CAPABILITIES`.
        value: the value typed, as config problems show it (``'"user"'``), or "" when the field's presence asks.

    Returns:
        None when the VMM has the capability, else ``(field, message)`` for the config problem
        ``<field>: <message>``.

    Raises:
        UnknownCapability: ``capability`` is not in :data:`CAPABILITIES`.
    """
    cap = CAPABILITIES.get(capability)
    if cap is None:
        raise UnknownCapability(f"capability {capability!r} is not one of {', '.join(CAPABILITIES)}")
    why = profile(vmm_type).lacks.get(capability)
    if why is None:
        return None
    message = cap.refusal.format(value=value + " " if value else "", vmm=vmm_type,
                                 having=" or ".join(having(capability)), why=f" ({why})" if why else "")
    return cap.field, message
