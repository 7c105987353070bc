# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.volume_backup`` (:func:`run_volume_backup`) and its argument spec: the backup,
verification or restore of a volume of any driver (:func:`host.backup.volume_backup`, audited in a host store with
``host_config``), recorded as an Event of a CloudVM with ``event`` (:func:`k8s.backup_events.run_with_events`,
the Kubernetes backend).
"""

from __future__ import annotations

from typing import Any, Dict

from ansible_collections.zjusct.cloud.plugins.module_utils.host.backup import backup_argument_spec, volume_backup
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.backup_events import event_argument_spec, run_with_events


def volume_backup_argument_spec() -> Dict[str, Any]:
    """The ``zjusct.cloud.volume_backup`` module's argument spec: the backup options of every driver
    (:func:`host.backup.backup_argument_spec`) and ``event`` with kubernetes.core's connection options
    (:func:`k8s.backup_events.event_argument_spec`)."""
    return dict(backup_argument_spec(any_driver=True), **event_argument_spec())


def run_volume_backup(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The ``zjusct.cloud.volume_backup`` module: :func:`host.backup.volume_backup`, recorded as an Event of the
    CloudVM ``event`` when given.

    Returns:
        The module result (the RETURN keys of plugins/modules/volume_backup.py), with ``event`` when one was written.

    Raises:
        CloudError: as :func:`host.backup.volume_backup` (BackupError, VolumeQuotaError, RbdError, a bad option
            named), or Events may not be written (:func:`k8s.backup_events.run_with_events`).
    """
    return run_with_events(params, lambda: volume_backup(params, check_mode), check_mode)
