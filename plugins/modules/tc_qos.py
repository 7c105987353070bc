#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tc_qos
short_description: Shape a device's traffic per VM with an HTB tree through netlink (guarantee, borrow, preempt)
version_added: "0.1.0"
description:
  - Manages an HTB tree on O(device) (or, for O(direction=ingress), on an IFB device the device's ingress is
    redirected to) through netlink (pyroute2), optionally inside a network namespace.
  - "Managed objects: the root qdisc C(htb 7a:), the root class C(7a:1) (rate = ceil = O(root_rate_mbps)), the
    default class C(7a:ffff) for unclassified traffic, one class per VM C(7a:<minor>) (minor 0x10..0xfff) with
    rate = guaranteed and ceil = guaranteed + granted, an explicit quantum (clamp(rate/10, MTU+14, 200000) bytes,
    so the kernel never warns 'quantum of class is big') and burst/cburst of 10 ms at rate/ceil, and one u32
    filter per class (handle C(800::<minor>), preference 10) matching the VM's MAC or IPv4 address."
  - "Direction: O(direction=egress) shapes what leaves O(device) (for a VM's TAP: traffic to the guest; matched on
    destination MAC/IPv4). O(direction=ingress) shapes what enters O(device) (from the guest): an C(ingress) qdisc
    with a mirred redirect (preference 122) sends it to the IFB O(ifb), where the HTB tree matches the source
    MAC/IPv4."
  - Reads the kernel's qdiscs, classes and filters and changes only what differs, in netlink batches; a second run
    with the same parameters reports C(changed=false). O(state=absent) removes only the managed objects.
  - Either give the classes directly (O(classes)) or give O(node), O(pools) and O(requests) and let the module
    arbitrate (guarantee, borrow from the pool, preempt lower priority, deny), see docs/qos.md.
  - For VMs managed by the host backend, the backend applies bandwidth itself (same code); this module is for
    operators and tests.
author: ZJUSCT cloud team (@zjusct)
requirements:
  - pyroute2 >= 0.9, < 0.10 on the managed node
  - Linux with sch_htb, cls_u32, act_mirred and ifb (ingress direction); root (CAP_NET_ADMIN)
attributes:
  check_mode:
    support: full
    description: Computes and reports the classes it would change without touching the kernel or the store.
  diff_mode:
    support: full
    description: Shows the device's managed classes before and after.
options:
  device:
    description: Network device to shape (for a VM, its TAP device).
    type: str
    required: true
  netns:
    description: Name of the network namespace (under C(/run/netns)) holding O(device). Omit for the current one.
    type: str
  direction:
    description: C(egress) shapes traffic leaving O(device); C(ingress) shapes traffic entering it, via O(ifb).
    type: str
    choices: [egress, ingress]
    default: egress
  ifb:
    description:
      - IFB device for O(direction=ingress); created (marked with the alias C(zjusct.cloud tc_qos ifb for
        <device>)) when missing, deleted with O(state=absent). An existing link of that name is used only when
        its alias names O(device); otherwise the task fails before changing anything.
      - Default C(zqi) + O(device) when that is shorter than 15 characters, else the first 7 characters of
        C(zqi) + O(device) followed by 8 hex digits of its sha256, so devices sharing a prefix get distinct IFBs
        (IFNAMSIZ, 1-15 characters). IFBs left for O(device) under another name (an earlier naming rule) are removed.
    type: str
  root_rate_mbps:
    description: Rate and ceil of the root class C(7a:1), Mbit/s (1..4000000); no class ceil may exceed it.
    type: int
    default: 10000
  default_rate_mbps:
    description: Rate of the default class C(7a:ffff) for traffic no filter matches, Mbit/s.
    type: int
    default: 1
  default_ceil_mbps:
    description: Ceil of the default class, Mbit/s. Default O(root_rate_mbps).
    type: int
  classes:
    description: The complete list of VM classes wanted on the device (classes not listed are removed).
    type: list
    elements: dict
    suboptions:
      name:
        description: Name of the class (VM id); used in messages and results.
        type: str
        required: true
      classid:
        description:
          - C(auto), an integer minor (16..4095) or C(7a:<hex minor>).
          - C(auto) keeps the class an existing filter with the same match uses, else takes the lowest free minor.
        type: raw
        default: auto
      rate_mbps:
        description: Guaranteed rate, Mbit/s (1..4000000).
        type: int
        required: true
      ceil_mbps:
        description: Ceiling, Mbit/s (O(classes[].rate_mbps)..O(root_rate_mbps)). Default the rate.
        type: int
      match:
        description: How the VM's traffic is recognised; exactly one of C(mac), C(ipv4).
        type: dict
        required: true
        suboptions:
          mac:
            description: The guest's MAC (destination for egress, source for ingress).
            type: str
          ipv4:
            description: The guest's IPv4 address (destination for egress, source for ingress).
            type: str
  node:
    description: Node capacity for the O(requests) form.
    type: dict
    suboptions:
      nic_mbps:
        description: NIC rate, Mbit/s.
        type: int
        required: true
      ratio:
        description: Bandwidth overcommit ratio; the sum of guarantees may reach nic_mbps x ratio. (0, 100].
        type: float
        default: 1.0
  pools:
    description: Shared pools for the O(requests) form.
    type: list
    elements: dict
    suboptions:
      name:
        description: Pool name.
        type: str
        required: true
      capacity_mbps:
        description: Pool capacity, Mbit/s; bounds the sum of guarantees and the sum of ceilings of its VMs.
        type: int
        required: true
  requests:
    description:
      - VM requests arbitrated in the given order (priority decides preemption, not the order). Admitted VMs get a
        class with rate = guaranteed and ceil = guaranteed + granted; VMs whose guarantee does not fit get none.
    type: list
    elements: dict
    suboptions:
      vm:
        description: VM id.
        type: str
        required: true
      guaranteed_mbps:
        description: Guaranteed rate, Mbit/s.
        type: int
        required: true
      ceil_mbps:
        description: Requested ceiling, Mbit/s (guaranteed..pool capacity). Default the guarantee.
        type: int
      priority:
        description: Larger preempts smaller (only borrowed bandwidth, never a guarantee).
        type: int
        default: 0
      pool:
        description: Pool to borrow from.
        type: str
        default: default
      classid:
        description: As O(classes[].classid).
        type: raw
        default: auto
      match:
        description: As O(classes[].match).
        type: dict
        required: true
        suboptions:
          mac:
            description: The guest's MAC.
            type: str
          ipv4:
            description: The guest's IPv4 address.
            type: str
  store_path:
    description: Host store (SQLite) where the arbitration decisions are recorded as events when something changed.
    type: path
  state:
    description: C(present) makes the managed tree match; C(absent) removes the managed objects only.
    type: str
    choices: [present, absent]
    default: present
notes:
  - Units are Mbit/s (10^6 bit/s) on the wire (Ethernet header included); TCP goodput is about 95.6 % of it at
    MTU 1500 (payload 1448 of 1514 bytes per frame).
seealso:
  - name: docs/qos.md
    description: The bandwidth model, pools, events and the host backend wiring.
    link: https://github.com/zjusct/cloud/blob/main/docs/qos.md
"""

EXAMPLES = r"""
- name: Two VMs on a bridge port, matched by MAC
  zjusct.cloud.tc_qos:
    device: zjt0a1b2c3d4e
    netns: zjcloud
    root_rate_mbps: 1000
    classes:
      - {name: vm-a, rate_mbps: 10, ceil_mbps: 50, match: {mac: "02:00:00:00:00:0a"}}
      - {name: vm-b, rate_mbps: 20, match: {mac: "02:00:00:00:00:0b"}}

- name: Shape traffic from the guests (TAP ingress through an IFB)
  zjusct.cloud.tc_qos:
    device: zjt0a1b2c3d4e
    netns: zjcloud
    direction: ingress
    ifb: zqi0a1b2c3d4e
    classes:
      - {name: vm-a, rate_mbps: 10, ceil_mbps: 50, match: {mac: "02:00:00:00:00:0a"}}

- name: Let the module arbitrate a pool
  zjusct.cloud.tc_qos:
    device: br-uplink
    node: {nic_mbps: 1000, ratio: 1.0}
    pools: [{name: tenant-a, capacity_mbps: 100}]
    requests:
      - {vm: low, guaranteed_mbps: 20, ceil_mbps: 80, priority: 0, pool: tenant-a, match: {ipv4: 10.0.0.2}}
      - {vm: high, guaranteed_mbps: 10, ceil_mbps: 60, priority: 5, pool: tenant-a, match: {ipv4: 10.0.0.3}}
    store_path: /var/lib/zjusct-cloud/cloud.db
  register: qos

- name: Remove what tc_qos manages on the device
  zjusct.cloud.tc_qos:
    device: zjt0a1b2c3d4e
    netns: zjcloud
    state: absent
"""

RETURN = r"""
ops:
  description: The operations planned (check mode) or applied, in order.
  returned: always
  type: list
  elements: str
  sample: ["qdisc-add", "class-put 7a:10 rate 10000000bit ceil 50000000bit quantum 125000",
           "filter-put 800::10 -> 7a:10"]
classes:
  description: The VM classes wanted (state=present), with their resolved class ids.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "vm-a", "classid": "7a:10", "rate_mbps": 10, "ceil_mbps": 50}]
decisions:
  description: Arbitration decisions (requests form), one per request in order.
  returned: always
  type: list
  elements: dict
  sample: [{"vm": "high", "outcome": "preempted", "admitted": true, "granted_mbps": 50,
            "preemptions": [{"vm": "low", "lost_mbps": 40}], "reason": "..."}]
kernel_warnings:
  description: Warnings the kernel attached to successful requests (netlink extended acks); expected empty.
  returned: always
  type: list
  elements: str
  sample: []
diff:
  description: Managed classes before and after (classid, rate_mbps, ceil_mbps, quantum, match keys).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.host.tc_qos_module import (  # the spec is shared with tests
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_TOGETHER,
    run_tc_qos,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=MUTUALLY_EXCLUSIVE, required_together=REQUIRED_TOGETHER,
        supports_check_mode=True,
    )
    run_module(module, run_tc_qos)


if __name__ == "__main__":
    main()
