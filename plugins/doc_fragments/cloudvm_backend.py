# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the backend switch and the host backend's options."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  backend:
    description:
      - Where CloudVMs live.
      - V(host) is the single-host cloud (the embedded default) with a SQLite host store, launchers run as
        supervised processes (or systemd services), file-backed root volumes, a bridge in the cloud's
        network namespace. Configured by O(host_config), which C(site.yml) writes.
      - V(kubernetes) uses CloudVM custom resources through the Kubernetes API with the connection options
        below.
      - Falls back to the E(ZJUSCT_CLOUD_BACKEND) environment variable, then V(host).
      - The inventory plugin C(zjusct.cloud.cloudvm) names the same two as its C(source), with another default
        (V(kubernetes), E(ZJUSCT_CLOUD_INVENTORY_SOURCE)); docs/architecture.md, "The backend choice", says why.
    type: str
    choices: [host, kubernetes]
  host_config:
    description:
      - Path of the host backend's configuration (JSON written by the C(zjusct.cloud.hypervisor) role) with the
        store path, images directory, network namespace, bridge, subnet, runtime and log directories.
      - Falls back to E(ZJUSCT_CLOUD_CONFIG), then C(/etc/zjusct-cloud/host.json).
      - Only used when O(backend=host).
    type: path
"""
