# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.host_volume_info``: the host store's root volumes (:func:`host.volumes.list_volumes`)."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import list_volumes


def run_host_volume_info(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.host_volume_info`` module: :func:`host.volumes.list_volumes` (read-only, the same in
    check mode).

    Returns:
        ``{"changed": False, "volumes", "volume_driver", "rbd", "host_config"}``.

    Raises:
        VolumeError: the host configuration cannot be read or names an unknown driver.
    """
    return list_volumes(params)
