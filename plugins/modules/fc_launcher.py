#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: fc_launcher
short_description: Run, stop or remove one launcher instance (one boot of one VM, under QEMU or Firecracker) on a host
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Manages one instance of the zjusct.cloud launcher (launcher protocol v1, see docs/launcher-protocol.md), that is one
    boot of one VM under QEMU or Firecracker.
  - O(state=started) writes the launcher config for O(boot_id), validates it with the launcher's C(check)
    command and starts the launcher as a systemd transient unit where systemd is PID 1, otherwise as a detached
    session leader. The same VM and boot already running, or already ended, is no change; a boot that ended is
    never started again (a new boot needs a new O(boot_id)).
  - Never two launchers for one VM. The launcher holds a lock for its whole life (inherited by its VMM), and a
    start while another boot of the VM is alive fails, naming that boot (case L5, docs/architecture.md "Failure cases").
  - O(state=stopped) asks the launcher to stop (graceful guest shutdown, kill after its stop timeout) and waits
    until no launcher or VMM of the VM remains. O(state=absent) also removes the VM's launcher files.
  - The C(zjusct.cloud.cloudvm) module (host backend) uses the same code; use this module directly to run a
    hand-written launcher config.
options:
  name:
    description: VM name (a DNS label).
    type: str
    required: true
  namespace:
    description: VM namespace.
    type: str
    default: default
  boot_id:
    description: The boot this instance runs (C(vm.bootID) of the config). Required for O(state=started).
    type: int
  config:
    description:
      - The LauncherConfig v1 document (C(apiVersion=launcher.cloud.zjusct.io/v1)). The module fills in the
        per-boot paths (C(runtimeDir), C(result.path), C(readyMarkerPath), C(serialLogPath)) and
        C(vm.namespace/name/bootID) from its own options. Required for O(state=started).
      - The module passes C(hypervisor) as given; set C(hypervisor.runAs) (and for Firecracker C(hypervisor.jailer))
        there to run the VMM as an unprivileged uid (docs/security.md). Only the host backend fills it in itself.
    type: dict
  state:
    description: Desired state of the instance.
    type: str
    choices: [started, stopped, absent]
    default: started
  wait_timeout:
    description: Seconds to wait for a stop to complete.
    type: int
    default: 300
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reports whether it would start or stop without doing it.
  diff_mode:
    support: none
    description: Reports the instance's state, not a diff.
"""

EXAMPLES = r"""
- name: Run boot 3 of a VM from a hand-written config
  zjusct.cloud.fc_launcher:
    name: lab1
    boot_id: 3
    config: "{{ lookup('ansible.builtin.file', 'lab1.json') | from_json }}"

- name: Stop it and wait until the VMM is gone
  zjusct.cloud.fc_launcher:
    name: lab1
    state: stopped
"""

RETURN = r"""
running:
  description: Whether a launcher of the VM is alive after the task.
  returned: always
  type: bool
  sample: true
boot_id:
  description: The boot that is alive, or the one named by O(boot_id).
  returned: always
  type: int
  sample: 3
pid:
  description: Pid of the live launcher.
  returned: when running
  type: int
  sample: 12345
observation:
  description: What is known of the boot (C(state) alive, starting, exited or lost, C(readyAt), C(result)).
  returned: always
  type: dict
  sample: {state: exited, result: {reason: GuestShutdown, exitCode: 0}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.host.fc_launcher_module import run_fc_launcher
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = {
    "name": {"type": "str", "required": True},
    "namespace": {"type": "str", "default": "default"},
    "boot_id": {"type": "int"},
    "config": {"type": "dict"},
    "state": {"type": "str", "choices": ["started", "stopped", "absent"], "default": "started"},
    "host_config": {"type": "path"},
    "wait_timeout": {"type": "int", "default": 300},
}
REQUIRED_IF = [("state", "started", ("boot_id", "config"))]


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    run_module(module, run_fc_launcher)


if __name__ == "__main__":
    main()
