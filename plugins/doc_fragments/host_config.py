# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the host backend's configuration file, for modules that act on one host only."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  host_config:
    description:
      - Path of the host backend's configuration (JSON written by the C(zjusct.cloud.hypervisor) role) with the
        store path, images directory, network namespace, bridge, subnet, runtime and log directories.
      - Falls back to E(ZJUSCT_CLOUD_CONFIG), then C(/etc/zjusct-cloud/host.json).
    type: path
"""
