# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one builder of the launcher's input document, LauncherConfig v1 (docs/launcher-protocol.md), for both
backends (pure).

What comes from the CloudVM is the same everywhere (the VM's identity and boot, its machine size, the guest's
identity: host name, instance id and SSH keys); what a backend decides is a small record of placement facts,
:class:`Placement` (paths as the launcher sees them, the network, the root disk, the hypervisor settings). The host
reconciler (:func:`host.reconciler.launcher_config`) and the controller (``zjusct_controller.pod.launcher_config``)
each build a Placement and call :func:`launcher_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model import disk_io
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import with_defaults

# the launcher's own zjusct_launcher.API_VERSION (tests/unit/module_utils/test_api_keys_once.py)
API_VERSION = "launcher.cloud.zjusct.io/v1"
KIND = "LauncherConfig"


@dataclass(frozen=True)
class Placement:
    """Where and how one boot runs, as a backend decided it (the LauncherConfig fields of the same names).

    Attributes:
        boot: ``{"kernel", "initrd", "cmdline"}`` (paths as the launcher sees them).
        root_disk: ``rootDisk`` (``{"path"|"rbd", "cache"}``).
        network: ``network`` (``mode``, ``tap``, ``createTap``, ``bridge``?, ``mac``, ``ipv4``, ``gateway``,
            ``dns``).
        hypervisor: ``hypervisor`` (``type``, ``accel``, the TCG and sandbox settings).
        readiness: ``readiness`` (``timeoutSeconds``, and ``host``/``port`` where the probe needs them).
        stop_timeout_seconds: ``stopTimeoutSeconds``.
        runtime_dir, serial_log_path: ``runtimeDir``, ``serialLogPath``.
        result: ``result`` (``path``, optionally ``terminationMessagePath``).
        ready_marker_path: ``readyMarkerPath`` (None: the launcher's default in its runtime directory).
        boot_slots: ``bootSlots`` (``{"directory", "count"}``), None for none.
        disk_io_limits: the operator's disk I/O limits (:data:`model.spec.DISK_IO` keys), None for none; with the VM's
            ``spec.diskIO`` they make ``rootDisk.ioLimits`` (:func:`model.disk_io.effective`).
        serial_console: ``serialConsole`` (``{"socketPath", "uid", "gid"}``), None for none (the serial log only).
    """

    boot: dict
    root_disk: dict
    network: dict
    hypervisor: dict
    readiness: dict
    stop_timeout_seconds: int
    runtime_dir: str
    serial_log_path: str
    result: dict
    ready_marker_path: Optional[str] = None
    boot_slots: Optional[dict] = field(default=None)
    disk_io_limits: Optional[dict] = field(default=None)
    serial_console: Optional[dict] = field(default=None)


def launcher_config(vm: dict, placement: Placement) -> dict:
    """The LauncherConfig of the CloudVM's current boot (``spec.bootID``) placed as ``placement`` says.

    Args:
        vm: the CloudVM (``metadata`` with namespace, name, uid; ``spec``).
        placement: the backend's facts.

    Returns:
        The document (docs/launcher-protocol.md §3): the guest's host name is the VM's name, its instance id the
        VM's uid (the identity disk, docs/guest-image.md), its keys ``spec.sshAuthorizedKeys``; the root disk's
        ``ioLimits`` are those of :func:`model.disk_io.effective` (absent when nothing is limited), its ``sizeMiB``
        ``spec.rootVolumeSizeMiB`` (absent when unset: the launcher grows a smaller disk to it before the guest runs).
    """
    meta, spec = vm["metadata"], with_defaults(vm.get("spec") or {})
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "vm": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
               "bootID": int(spec["bootID"])},
        "machine": {"vcpus": int(spec["vcpus"]), "memoryMiB": int(spec["memoryMiB"])},
        "boot": dict(placement.boot),
        "rootDisk": dict(placement.root_disk),
        "identity": {"hostname": meta["name"], "instanceID": meta["uid"],
                     "sshAuthorizedKeys": list(spec.get("sshAuthorizedKeys") or [])},
        "network": dict(placement.network),
        "hypervisor": dict(placement.hypervisor),
        "readiness": dict(placement.readiness),
        "stopTimeoutSeconds": int(placement.stop_timeout_seconds),
        "runtimeDir": placement.runtime_dir,
        "serialLogPath": placement.serial_log_path,
        "result": dict(placement.result),
    }
    if placement.ready_marker_path:
        doc["readyMarkerPath"] = placement.ready_marker_path
    if placement.boot_slots:
        doc["bootSlots"] = dict(placement.boot_slots)
    if placement.serial_console:
        doc["serialConsole"] = dict(placement.serial_console)
    io_limits = disk_io.effective(spec.get("diskIO"), placement.disk_io_limits)
    if io_limits:
        doc["rootDisk"]["ioLimits"] = io_limits
    if spec.get("rootVolumeSizeMiB") is not None:
        doc["rootDisk"]["sizeMiB"] = int(spec["rootVolumeSizeMiB"])
    return doc
