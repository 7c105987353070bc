#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cloudvm
short_description: Declare a persistent virtual machine (CloudVM) and drive its power state
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Creates, updates, starts, stops, restarts and deletes a CloudVM (C(cloud.zjusct.io/v1alpha1)), the one
    object a user declares for a persistent VM, on the single-host backend or on Kubernetes.
  - Starting is explicit and idempotent. O(power_state=running) on a VM that is not running its current
    boot increments C(spec.bootID) exactly once; a VM that is already Running (or starting) is left alone,
    so retrying a task never boots twice. A VM whose guest shut itself down stays stopped until it is
    started again, which gives it C(bootID + 1).
  - With O(wait=true) the task returns when the target phase is reached; Running means the guest's SSH
    banner answered, Stopped means no launcher remains.
  - O(state=absent) deletes the CloudVM (stopping it first) and waits until it is gone. The root volume and
    its ownership mark are kept.
  - On the host backend, creating a CloudVM on an existing volume checks its claim before anything is written;
    another owner's volume, or one held by a CloudVM that exists, is refused naming the holder; a claim left by a
    deleted CloudVM is released when nothing writes the volume any more, so the owner can re-create the VM on
    its kept volume (docs/runbooks.md).
  - Invalid values fail before anything is created; the message names the option (and the playbook variable
    where it differs), the API field, the value and the allowed range or rule; for O(memory_mib=4097) it begins
    with C(memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB\)).
extends_documentation_fragment:
  - zjusct.cloud.cloudvm_backend
  - kubernetes.core.k8s_auth_options
options:
  state:
    description: Whether the CloudVM exists.
    type: str
    choices: [present, absent]
    default: present
  name:
    description: Name of the CloudVM (a DNS label).
    type: str
    required: true
  namespace:
    description: Namespace of the CloudVM (on the host backend a plain grouping name).
    type: str
    default: default
  owner:
    description:
      - Stable user id that owns the VM and its root volume (a DNS label). Required to create; immutable.
      - On an existing VM it is also the acting user's id, and the task refuses (C(reason=Forbidden), both owners
        named) unless the VM's C(spec.owner) equals it, or O(operator=true). The playbooks always pass it; a
        task that omits it is an operator's own task. See docs/security.md.
    type: str
  operator:
    description:
      - Act as the cloud's operator on an existing VM of any owner; O(owner) is then neither compared with the VM's
        C(spec.owner) nor written to it (it names the owner of a VM being created only).
      - The explicit operator switch of the playbooks (C(-e operator=true)); never give it to a tenant's job
        template.
    type: bool
    default: false
  root_volume_claim:
    description:
      - Root volume of the VM; immutable. On Kubernetes a raw-block PVC in the same namespace, on the host
        backend a volume name in the host store (created from O(image) when missing).
      - Defaults to C(<name>-root).
    type: str
  vcpus:
    description:
      - Guest vCPUs, 1 to 4. Defaults to 1 on create; unchanged when omitted on update.
      - A change reaches the guest at its next boot; while a boot runs the task warns so (restart to apply it).
    type: int
  memory_mib:
    description:
      - Guest memory in MiB, 128 to 4096. Defaults to 512 on create; unchanged when omitted.
      - A change reaches the guest at its next boot; while a boot runs the task warns so (restart to apply it).
    type: int
  power_state:
    description:
      - V(running) starts the VM unless it is already running its current boot (then nothing changes).
      - V(stopped) stops it (graceful guest shutdown, forced after the launcher's stop timeout).
      - Omitted leaves the power state as it is.
    type: str
    choices: [running, stopped]
  restart:
    description:
      - Stop the VM, wait until it is Stopped, then start it with C(bootID + 1). Implies O(power_state=running).
    type: bool
    default: false
  ssh_authorized_keys:
    description:
      - OpenSSH public keys injected into the guest at boot (at most 16); given, they replace the VM's keys.
      - A change takes effect at the next boot (C(bootID + 1)), the same in the guest and, on the host backend, on
        the SSH gateway (docs/security.md). A guest installs the keys of its boot at that boot and keeps them
        until the boot ends, and the gateway grants the keys of the boot that runs, so until the VM is restarted
        the new keys do not log in and removed ones still do. A VM that is not running takes them at its next
        start (the gateway at once). RV(ssh_authorized_keys_boot_id) names that boot, and the task warns when a
        boot with the old keys keeps running; use O(restart=true) (playbook C(vm_restart)) to apply them now.
    type: list
    elements: str
  bandwidth:
    description: Network bandwidth of the VM's interface (tc HTB; see docs/qos.md).
    type: dict
    suboptions:
      guaranteed_mbps:
        description: Guaranteed rate in Mbit/s (0 to 100000).
        type: int
        default: 0
      ceil_mbps:
        description: Ceiling in Mbit/s the VM may borrow up to from its pool; at least O(bandwidth.guaranteed_mbps).
        type: int
      pool:
        description: Shared pool the VM borrows from.
        type: str
      priority:
        description: Borrowing priority 0 to 1000; a higher priority may preempt lower-priority borrowers.
        type: int
        default: 0
  disk_io:
    description:
      - Disk I/O limits of the VM's root disk (C(spec.diskIO); QEMU block I/O throttling, Firecracker drive rate
        limiter; docs/api/cloudvm.md "DiskIO"). Each suboption given sets that limit and the others are kept;
        V(0) removes the VM's own limit of that kind (the operator's still applies).
      - The operator's limits (host C(hypervisor_disk_io_limits), controller C(diskIOLimits)) are the default and
        the most a VM gets; a limit here can only lower one of them.
      - A change reaches the guest at its next boot; while a boot runs the task warns so (restart to apply it).
    type: dict
    suboptions:
      read_bytes_per_second:
        description: Most bytes per second the guest reads, 1048576 (1 MiB/s) to 1099511627776; V(0) removes it.
        type: int
      write_bytes_per_second:
        description: Most bytes per second the guest writes, 1048576 (1 MiB/s) to 1099511627776; V(0) removes it.
        type: int
      read_iops:
        description: Most read requests per second, 20 to 10000000; V(0) removes it.
        type: int
      write_iops:
        description: Most write requests per second, 20 to 10000000; V(0) removes it.
        type: int
  labels:
    description: Labels of the CloudVM (merged into existing labels).
    type: dict
  node_selector:
    description:
      - Kubernetes backend only. Node labels the VM's launcher Pod must match (C(spec.nodeSelector)).
    type: dict
  anti_affinity_group:
    description:
      - Anti-affinity group (C(spec.antiAffinityGroup)), an RFC 1123 DNS label such as C(web). Running VMs of the
        same owner in the same group never share a node; a boot that finds every node taken by the group is
        C(Pending/Unschedulable), its message naming the group. Groups of different owners never constrain each
        other.
      - On Kubernetes the launcher Pod's required pod anti-affinity (C(kubernetes.io/hostname)); on the host
        backend, one node, a second VM of a group that already runs there is Unschedulable.
      - Takes effect at the VM's next boot; V("") removes it.
    type: str
  image:
    description:
      - Host backend only. Image set (name such as C(debian-bookworm), a full versioned name, or a path to an
        image set directory) copied into a new root volume when O(root_volume_claim) does not exist yet.
      - Defaults to the host configuration's default image.
    type: str
  volume_size_mib:
    description:
      - Size in MiB of the root volume (C(spec.rootVolumeSizeMiB), 1 to 16777216). A new root volume (host backend)
        is made that large (at least the image's size).
      - An existing root volume is grown to it at the VM's next boot, on both backends - the launcher grows the disk
        before the guest runs and the guest's root file system fills it at that boot; a running VM is warned (as for
        O(vcpus)). A root volume never shrinks - a size below the one asked before is refused, and on the host also
        a size below the volume's. On the host the owner's C(disk_mib) quota counts the growth when it is written.
    type: int
  delete_volume:
    description:
      - Host backend only, with O(state=absent). Also delete the root volume (file and record) once the VM is
        stopped and deleted. Without it the volume and its ownership mark are kept.
      - When the VM no longer exists (an earlier delete kept its volume), delete the kept volume C(<name>-root)
        instead, if it belongs to O(owner) (or O(operator) is set) and no CloudVM holds or names it and no process
        writes it; RV(volume_deleted) names it. No such volume changes nothing.
    type: bool
    default: false
  wait:
    description:
      - Wait until the target phase (Running with SSH ready, Stopped, or deleted) is reached.
      - A VM whose last boot ended in phase C(Failed) is off too, so a wait for Stopped ends there; the task then
        returns a warning naming the boot, the reason and the message (RV(phase) is C(Failed)).
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait when O(wait=true); on timeout the task fails showing the last phase and reason.
    type: int
    default: 600
attributes:
  check_mode:
    support: full
    description: Reports what would change without creating, starting or stopping anything.
  diff_mode:
    support: full
    description: Shows the CloudVM's spec before and after.
requirements:
  - With O(backend=kubernetes) on the managed node, the Python library C(kubernetes) (24.2.0 or later) and the
    collection C(kubernetes.core).
notes:
  - >-
    On Kubernetes the API server enforces the same rules (OpenAPI schema and CEL rules), so kubectl, AWX and
    this module get the same refusal; the module reports the server's message, which names the field path
    such as C(spec.owner: Forbidden: is immutable), followed by the old and new value. A refused
    request changes nothing.
  - On Kubernetes, check mode is a server-side dry run, so it validates exactly like a real run.
  - On Kubernetes every write carries the resourceVersion the plan was computed from; when another client
    wrote in between (HTTP 409) the module reads again and re-plans, so concurrent or retried starts request
    one boot only.
  - On Kubernetes, O(root_volume_claim) names a raw-block PersistentVolumeClaim in the same namespace; this
    module does not create it. Waits rely on the controller's C(status.observedGeneration) and C(status.bootID).
    O(image) is ignored there (with a warning).
  - O(state=absent) on Kubernetes deletes with foreground propagation, so the CloudVM is gone only after its
    launcher Pod is.
  - On Kubernetes a wait for Running takes a status that says Running only when its launcher Pod (C(status.pod)) is
    there and C(Ready) (one GET, asked once the status says Running). The status is written by the controller
    alone; a controller that is down (its node lost with the VM's) leaves a stale Running, so the wait goes on and
    its timeout names the Pod, why it is not Ready and its node. Without the right to read Pods, or when they cannot
    be reached, the status is taken as before (docs/controller.md, "Status").
seealso:
  - module: zjusct.cloud.cloudvm_info
  - module: zjusct.cloud.fc_launcher
"""

EXAMPLES = r"""
- name: Start alice's VM on this host (created with a root volume from the default image if missing)
  zjusct.cloud.cloudvm:
    name: alice
    owner: alice
    vcpus: 1
    memory_mib: 1024
    ssh_authorized_keys:
      - "{{ lookup('ansible.builtin.file', '~/.ssh/id_ed25519.pub') }}"
    power_state: running
  register: vm

- name: Print how to reach it
  ansible.builtin.debug:
    msg: "ssh root@{{ vm.cloudvm.status.sshEndpoint.host }}"

- name: Stop it and return only when it is off
  zjusct.cloud.cloudvm:
    name: alice
    power_state: stopped

- name: Replace alice's keys and restart so that the new boot (bootID + 1) and the SSH gateway use them now
  zjusct.cloud.cloudvm:
    name: alice
    owner: alice
    ssh_authorized_keys:
      - "{{ lookup('ansible.builtin.file', '~/.ssh/id_ed25519_new.pub') }}"
    restart: true

- name: Restart on Kubernetes (stop, wait Stopped, start with bootID + 1)
  zjusct.cloud.cloudvm:
    backend: kubernetes
    kubeconfig: ~/.kube/config
    namespace: tenant-alice
    name: alice
    restart: true

- name: Create alice's VM on Kubernetes (kubeconfig from K8S_AUTH_KUBECONFIG), 100 Mbit/s guaranteed
  zjusct.cloud.cloudvm:
    backend: kubernetes
    namespace: tenant-alice
    name: alice
    owner: alice
    root_volume_claim: alice-root
    vcpus: 2
    memory_mib: 2048
    bandwidth:
      guaranteed_mbps: 100
      ceil_mbps: 1000
      pool: campus
    labels:
      course: hpc101
    power_state: running
    wait_timeout: 300

- name: Limit alice's root disk to 20 MiB/s and 500 requests/s of writes from her next boot on
  zjusct.cloud.cloudvm:
    name: alice
    owner: alice
    disk_io:
      write_bytes_per_second: 20971520
      write_iops: 500
    restart: true

- name: Delete the VM, keeping its root volume
  zjusct.cloud.cloudvm:
    name: alice
    state: absent
"""

RETURN = r"""
cloudvm:
  description: The CloudVM after the task (absent when deleted).
  returned: success
  type: dict
  sample:
    apiVersion: cloud.zjusct.io/v1alpha1
    kind: CloudVM
    metadata: {name: alice, namespace: default, uid: 0d9c5e7e-3c43-4c53-9d3c-6a3c0b1e2f10}
    spec: {owner: alice, rootVolumeClaim: alice-root, vcpus: 1, memoryMiB: 512, powerState: Running, bootID: 1}
    status:
      phase: Running
      reason: SSHReady
      bootID: 1
      sshEndpoint: {host: 10.200.0.2, port: 22}
phase:
  description: The CloudVM's phase after the task.
  returned: success
  type: str
  sample: Running
boot_id:
  description: The bootID the VM's spec asks for after the task.
  returned: success
  type: int
  sample: 1
ssh_authorized_keys_boot_id:
  description:
    - The first bootID whose guest (and, on the host backend, SSH gateway) uses the C(spec.sshAuthorizedKeys) this
      task wrote; the running boot keeps the keys it booted with. RV(boot_id) + 1 after a re-key of a running VM,
      which also warns C(spec.sshAuthorizedKeys change takes effect at the next boot (bootID N+1)...).
  returned: success, when the task changed the keys of an existing VM
  type: int
  sample: 2
volume_deleted:
  description: The kept root volume a O(state=absent) task with O(delete_volume) deleted for a VM that no longer
    existed (host backend).
  returned: success, when such a volume was deleted
  type: str
  sample: alice-root
reason:
  description: Why the task was refused; C(Forbidden) when the VM belongs to another owner than O(owner).
  returned: failure, when the owner check refused
  type: str
  sample: Forbidden
vm_owner:
  description: The owner (C(spec.owner)) of the VM the task was refused on.
  returned: failure, when the owner check refused
  type: str
  sample: bob
api_status:
  description: HTTP status of the Kubernetes API's refusal (422 invalid, 403 forbidden, 404 not found).
  returned: failure on the kubernetes backend, when the API server refused the request
  type: int
  sample: 422
api_reason:
  description: Reason of the Kubernetes API's refusal (the Status reason).
  returned: failure on the kubernetes backend, when the API server refused the request
  type: str
  sample: Invalid
field_errors:
  description: The fields the API server refused, with its message for each.
  returned: failure on the kubernetes backend, when the API server refused the request
  type: list
  elements: dict
  sample:
    - field: spec.owner
      message: "Forbidden: is immutable (was alice, requested bob)"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import cloudvm_argument_spec, run_cloudvm
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module


def main() -> None:
    module = AnsibleModule(argument_spec=cloudvm_argument_spec(), supports_check_mode=True)
    run_module(module, run_cloudvm, diff=True)


if __name__ == "__main__":
    main()
