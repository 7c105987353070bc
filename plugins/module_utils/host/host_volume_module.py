# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.host_volume``: an existing RBD image registered as an owner's root volume
(:func:`host.volumes.adopt_volume`)."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import adopt_volume


def run_host_volume(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.host_volume`` module: :func:`host.volumes.adopt_volume`.

    Returns:
        ``{"changed": bool, "volume": record}``.

    Raises:
        VolumeError: bad name/owner, the name is taken by another volume, or the image was refused;
            VolumeQuotaError (``reason: QuotaExceeded``) over the owner's disk quota.
    """
    return adopt_volume(params, check_mode)
