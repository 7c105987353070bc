# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.rbd_backup`` (:func:`run_rbd_backup`) and its argument spec: volume_backup's work
for an RBD image (:func:`host.backup.rbd_backup`), recorded as an Event of a CloudVM with ``event``
(:func:`k8s.backup_events.run_with_events`).
"""

from __future__ import annotations

from typing import Any, Dict

from ansible_collections.zjusct.cloud.plugins.module_utils.host.backup import backup_argument_spec, rbd_backup
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.backup_events import event_argument_spec, run_with_events


def rbd_backup_argument_spec() -> Dict[str, Any]:
    """The ``zjusct.cloud.rbd_backup`` module's argument spec: volume_backup's without the host store and file forms
    (:func:`host.backup.backup_argument_spec`) and ``event`` with kubernetes.core's connection options."""
    return dict(backup_argument_spec(any_driver=False), **event_argument_spec())


def run_rbd_backup(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The ``zjusct.cloud.rbd_backup`` module: :func:`host.backup.rbd_backup`, recorded as an Event of the CloudVM
    ``event`` when given.

    Returns:
        The module result (the RETURN keys of plugins/modules/rbd_backup.py), with ``event`` when one was written.

    Raises:
        CloudError: as :func:`host.backup.rbd_backup`, or Events may not be written.
    """
    return run_with_events(params, lambda: rbd_backup(params, check_mode), check_mode)
