#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_network
short_description: Prepare the single-host guest network and sweep leftover TAP devices
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Creates the cloud's network namespace, its bridge with the guests' gateway address, IPv4 forwarding inside
    that namespace, the NAT uplink and the nftables isolation tables, as configured in the host configuration
    (C(netns), C(bridge), C(subnet), C(nat); see docs/network.md and docs/security.md).
  - Changes no sysctl outside the cloud's namespace, except C(net.ipv4.ip_forward) on the uplink's outer side
    (the host) when the host configuration opts in with C(uplink_ip_forward); without it, warns when that
    forwarding is off (guests' NAT then ends at the host).
  - With O(sweep=true) removes the collection's TAP devices (C(zjt*)) that belong to no live launcher, left by
    a crash or an interrupted start (case L6 in docs/architecture.md "Failure cases"), and re-applies the isolation set
    elements of the VMs in the host store.
  - When the host configuration sets C(gateway_dir) (the role's C(hypervisor_ssh_gateway)), installs the SSH
    gateway's files there (C(sshd_config), an ed25519 host key, the C(keys/) directory), the system group
    C(zjusct-gateway), and the per-owner accounts C(zc-<owner>) and keys files from the VMs in the host store
    (docs/security.md). Starting the gateway's sshd is the role's (a systemd unit) or the operator's.
  - Idempotent; reports C(changed) only when it created, loaded, wrote or removed something; in check mode it
    reports whether the gateway's files would change without writing them.
options:
  sweep:
    description: Remove orphaned TAP devices and re-apply the isolation set elements.
    type: bool
    default: true
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reports what it would create or remove.
  diff_mode:
    support: none
    description: Reports created and removed devices, not a diff.
"""

EXAMPLES = r"""
- name: Bridge, namespace and forwarding for guests; remove orphaned TAPs
  zjusct.cloud.host_network:
    host_config: /etc/zjusct-cloud/host.json
"""

RETURN = r"""
removed_taps:
  description: Orphaned TAP devices removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [zjt0a1b2c3d4e]
gateway_known_hosts:
  description:
    - The SSH gateway's host key as a C(known_hosts) line for its address (C(gateway_host), else the node name) and
      port, for tenants' C(~/.ssh/known_hosts) (the jump connection checks it). Not a secret.
  returned: when the host configuration sets C(gateway_dir) and the gateway's host key exists
  type: str
  sample: "[hv1.example.org]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG..."
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.host.host_network_module import run_host_network
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = {"host_config": {"type": "path"}, "sweep": {"type": "bool", "default": True}}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_host_network)


if __name__ == "__main__":
    main()
