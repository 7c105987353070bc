#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: volume_backup
short_description: Verified offline backups of a root volume of any driver (file, qcow2, rbd), and restore into a
  new volume of any driver
version_added: 0.2.0
author: ZJUSCT cloud team (@zjusct)
description:
  - One module for the volumes of every host volume driver. V(present) takes one backup of a volume nobody
    writes (a stopped VM) - full, or incremental since the destination's previous backup. V(verified) checks a
    stored backup. V(restored) restores one into a NEW volume, of any driver whatever the backup was taken from.
  - "Every backup has the same format: one C(rbd diff v1) stream (C(data.rbdiff)), a C(manifest.json) with the
    checksum of the file and of every 4 MiB block of the volume (CRC32C, or sha256 where google-crc32c is
    missing), and a C(complete) marker written last, in C(<dest>/<id>/). A backup interrupted at any point has no
    C(complete) marker and no id-named directory; the next backup removes its leftovers."
  - "RBD images (driver C(rbd)): as M(zjusct.cloud.rbd_backup), of which this module is the general case - a
    snapshot, C(rbd export-diff) (a diff since the previous backup's snapshot), refused while the image has
    watchers."
  - "File-backed volumes (driver C(file): a raw file; C(qcow2): an overlay and its base, read as the guest sees
    them): refused while a process has the file open or holds QEMU's write lock on it; while the backup runs,
    QEMU cannot open the file for writing (a VM started meanwhile fails with QEMU's C(Failed to get \"write\"
    lock)). The volume is read once, 4 MiB at a time, holes and zero ranges skipped; a full backup stores
    every non-zero block, an incremental one only the blocks whose CRC32C differs from the previous backup's
    manifest (nothing is kept on the volume between backups). A backup never starts or changes the VM."
  - V(verified) re-reads every file of a backup's chain and checks it against the manifests, naming each damaged
    file and volume block. No volume is touched.
  - "V(restored) applies the chain (full first) to a new volume and compares every 4 MiB block of the result with
    the manifest before it is given its name; on any mismatch nothing is left at the target and the task fails
    naming the block. An RBD image is created with C(rbd import-diff); a file volume is written to a temporary
    name (C(<target>.restoring-<random>)), for qcow2 converted with C(qemu-img convert) (a standalone qcow2 with
    no backing file), read back, fsynced, then linked to its name (an existing file is never replaced)."
  - With O(target_volume) the restored volume is registered in the host store for its owner, as
    M(zjusct.cloud.host_volume) does for RBD images; for a file-backed volume the owner's C(disk_mib) quota is
    checked before anything is written and again in the transaction that records the volume (over it, the task
    fails with RV(reason=QuotaExceeded) and the restored file is removed). An RBD image keeps
    M(zjusct.cloud.host_volume)'s behaviour (over the quota it stays in the pool unregistered; the same restore
    run again registers it). A backup is given only to its owner unless O(operator=true).
  - Each V(present) run makes a new backup, so it always reports changed. Check mode reports the plan only.
  - With O(host_config), each backup and restore that changed something or failed is an audit record in that
    host's store (C(backup) / C(restore), subject C(rbd/<pool>/<image>) or C(volume/<name>)), and each
    registration a C(volume-register) record, listed by M(zjusct.cloud.audit_info). See docs/security.md, "Audit".
  - On Kubernetes, with O(event), each backup and restore that changed something or failed is an Event of the
    CloudVM (C(BackupCompleted), C(BackupFailed), C(RestoreCompleted), C(RestoreFailed)) that its namespace's users
    list with C(kubectl get events); see O(event).
requirements:
  - google-crc32c >= 1.5 (optional; CRC32C checksums, needed to verify or restore a CRC32C backup)
  - C(qemu-img) on the managed node for qcow2 volumes; C(rbd) (ceph-common) for RBD images.
extends_documentation_fragment:
  - zjusct.cloud.volume_backup
  - zjusct.cloud.ceph
  - zjusct.cloud.host_config
  - zjusct.cloud.backup_event
  - kubernetes.core.k8s_auth_options
options:
  dest:
    description:
      - Where this volume's backups are kept (created with mode 0700). A directory (a local disk or a mounted
        off-site target), as a path or a C(file://) URL; no other destination kind exists yet (another URL scheme
        is refused naming the kinds known).
    type: str
    required: true
  volume:
    description:
      - With V(present), the volume of the host store to back up (host backend; e.g. C(alice-root)). Its driver
        and location come from the store; O(owner), when given, must be its owner (unless O(operator=true)).
      - Exactly one of O(volume), O(path) and O(name).
    type: str
  path:
    description: With V(present), the file of a file-backed volume (O(driver) V(file) or V(qcow2)).
    type: path
  driver:
    description:
      - The driver of the volume given by O(path) (V(file) is a raw file, V(qcow2) a qcow2 file) or by O(name)
        (V(rbd)). Ignored with O(volume) (the store's record names it).
    type: str
    choices: [file, qcow2, rbd]
  pool:
    description: Pool of the source RBD image (V(present) with O(name)).
    type: str
    default: rbd
  name:
    description: With V(present), the source RBD image.
    type: str
  full_every:
    description: Maximum chain length (1 to 10000); a full backup is taken when the chain would get longer.
    type: int
    default: 7
  force_full:
    description: Take a full backup even when an incremental one is possible.
    type: bool
    default: false
  watcher_grace_seconds:
    description: RBD only - seconds to keep re-checking an image that has watchers before refusing.
    type: float
    default: 35
  allow_watchers:
    description: RBD only - back up an image that is open (crash-consistent only).
    type: bool
    default: false
  owner:
    description:
      - With V(present), the owner recorded in the manifest (default the volume's); must match the host store
        record or the RBD image's owner mark.
      - With V(restored), the owner of the new volume (default the manifest's); another than the manifest's is
        refused unless O(operator=true).
    type: str
  target_volume:
    description:
      - With V(restored), the NEW host store volume to restore into and register for the owner (e.g.
        C(alice-restored-root)); its data goes where O(target_driver) keeps a new volume of that name
        (C(<volumes_dir>/<name>.raw), C(<volumes_dir>/<name>.qcow2), or the image C(<rbd.pool>/<name>)).
      - Exactly one of O(target_volume), O(target_path) and O(target_name).
    type: str
  target_driver:
    description:
      - The driver of the restored volume. With O(target_volume) the default is the host configuration's
        C(volume_driver); with O(target_path) V(file) (V(qcow2) for a qcow2 file); with O(target_name) V(rbd).
    type: str
    choices: [file, qcow2, rbd]
  target_path:
    description: With V(restored), a NEW file to restore into (not registered anywhere).
    type: path
  target_pool:
    description: Pool of the new RBD image (V(restored) with O(target_name)); defaults to O(pool).
    type: str
  target_name:
    description: With V(restored), the NEW RBD image to restore into (not registered).
    type: str
  image:
    description:
      - With O(target_volume), the image set whose kernel and initrd boot the restored volume (name, versioned
        name or path); default the host configuration's C(default_image).
    type: str
  keep_snapshots:
    description: RBD only - with V(restored), keep the backup snapshots that import creates on the new image.
    type: bool
    default: false
  actor:
    description: Who acts, for the audit records written with O(host_config) and the Event written with O(event).
      Defaults to O(owner), else C(operator).
    type: str
  operator:
    description:
      - The operator switch (docs/security.md) - back up another owner's host store volume, or restore a backup
        for an owner other than its own; recorded in the audit record.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: V(present) reports whether the backup would be full or incremental and why; V(restored) checks
      the whole chain and the owner; nothing is written.
  diff_mode:
    support: none
    description: No diff is returned.
notes:
  - Why one module for every driver - the backups are the same format whatever the source, so verification,
    retention and restore (also across drivers) are the same code; M(zjusct.cloud.rbd_backup) stays, with its
    options and results unchanged, as the RBD-only case.
  - The Ceph connection options apply to RBD images given by O(name) / O(target_name); a host store volume's
    Ceph settings come from the host configuration.
seealso:
  - module: zjusct.cloud.rbd_backup
  - module: zjusct.cloud.host_volume
  - module: zjusct.cloud.audit_info
"""

EXAMPLES = r"""
- name: Back up alice's stopped VM's root volume (any driver), keep 7
  zjusct.cloud.volume_backup:
    volume: alice-root
    dest: /var/lib/zjusct-cloud/backups/default_alice
    owner: alice
    vm: default/alice
    keep: 7
  register: bk

- name: Verify the newest backup
  zjusct.cloud.volume_backup:
    state: verified
    dest: /var/lib/zjusct-cloud/backups/default_alice

- name: Restore it as a new volume of this host's driver, registered for alice
  zjusct.cloud.volume_backup:
    state: restored
    dest: /var/lib/zjusct-cloud/backups/default_alice
    backup_id: "{{ bk.backup_id }}"
    target_volume: alice-restored-root
    owner: alice

- name: Restore the same file-volume backup as an RBD image (across drivers)
  zjusct.cloud.volume_backup:
    state: restored
    dest: /var/lib/zjusct-cloud/backups/default_alice
    target_name: alice-moved-root
    target_pool: rbd

- name: On Kubernetes, back up a CloudVM's RBD image and record it as an Event of the CloudVM
  zjusct.cloud.volume_backup:
    pool: rbd
    name: tenant-alice.alice-root
    driver: rbd
    dest: /var/lib/zjusct-cloud/backups/tenant-alice_alice
    owner: alice
    vm: tenant-alice/alice
    actor: alice
    event:
      namespace: tenant-alice
      cloudvm: alice
    # Kubernetes credentials: kubeconfig/context or the K8S_AUTH_* environment, as kubernetes.core.k8s

- name: Back up a qcow2 file that is no host store volume
  zjusct.cloud.volume_backup:
    path: /srv/disks/lab.qcow2
    driver: qcow2
    dest: /srv/backup/lab
"""

RETURN = r"""
backup_id:
  description: Id of the backup made, verified or restored (C(YYYYmmddTHHMMSSZ-xxxxxx)).
  returned: success
  type: str
  sample: 20261203T101500Z-a904c0
driver:
  description: The driver of the volume backed up (V(present)), of the backup's source (V(verified)), or of the
    restored volume (V(restored)).
  returned: success
  type: str
  sample: file
volume:
  description:
    - With V(present), the host store volume backed up (null for O(path) / O(name)).
    - With V(restored) and O(target_volume), the registered volume record (name, driver, location, size_mib,
      owner, image).
  returned: success
  type: raw
owner:
  description: The backup's owner (V(present)) or the restored volume's (V(restored)).
  returned: when a backup or restore was done
  type: str
  sample: alice
type:
  description: V(full) or V(diff) (incremental).
  returned: state=present
  type: str
reason:
  description:
    - With V(present), why full or incremental was chosen.
    - On a failed V(restored) over the owner's C(disk_mib) quota, V(QuotaExceeded), with C(quota), C(limit),
      C(in_use) and C(requested) (MiB) as M(zjusct.cloud.host_volume) returns them.
  returned: state=present; failure over a quota
  type: str
  sample: diff since backup 20261203T101000Z-d2e385 (snapshot zjusct-backup-5d41402a-20261203T101000Z-d2e385)
dest_tag:
  description: This destination's tag (names the RBD snapshots it creates; links the streams of a file volume).
  returned: state=present
  type: str
snapshot:
  description: The snapshot name the backup's stream ends at (an RBD snapshot of the source image; for a
    file-backed volume a name only, linking the chain).
  returned: state=present and not check mode
  type: str
chain:
  description: Backup ids from the full backup to this one.
  returned: success
  type: list
  elements: str
bytes_written:
  description: Size in bytes of the stored data file.
  returned: state=present and not check mode
  type: int
data_bytes:
  description: Bytes of volume data the backup stores (the changed blocks of an incremental one).
  returned: state=present and not check mode
  type: int
image_size_bytes:
  description: Size in bytes of the volume (as backed up, or as restored).
  returned: success
  type: int
retention:
  description: C(keep), C(deleted), C(kept_for_chain) backup ids.
  returned: state=present with keep
  type: dict
removed_snapshots:
  description: RBD only - this destination's backup snapshots removed from the source image.
  returned: state=present and not check mode
  type: list
  elements: str
location:
  description: The restored volume's data, a path or C(pool/image).
  returned: state=restored
  type: str
  sample: /var/lib/zjusct-cloud/volumes/alice-restored-root.raw
verified_blocks:
  description: Number of 4 MiB blocks of the restored volume read back and matched with the manifest.
  returned: state=restored
  type: int
problems:
  description: Verification failures, each naming the backup, file or volume block and the byte range.
  returned: failure of verified or restored
  type: list
  elements: str
reason_code:
  description: Not returned; a quota refusal returns C(reason=QuotaExceeded) with C(quota), C(limit), C(in_use)
    and C(requested) as M(zjusct.cloud.host_volume) does.
  returned: never
  type: str
event:
  description: The Event written with O(event) for a backup or restore that changed something (its namespace,
    generated name, reason and type).
  returned: with event, when a backup or restore was done
  type: dict
  sample: {"namespace": "tenant-alice", "name": "alice.7xk2p", "reason": "BackupCompleted", "type": "Normal"}
seconds:
  description: Wall time of the operation in seconds.
  returned: when something was done
  type: float
phases:
  description:
    - Seconds spent in each phase. An RBD backup reports V(export), V(verify), V(fsync); a file-backed volume's
      V(read) (reading, checksumming and storing the stream), V(verify), V(fsync).
    - An RBD restore reports V(import) and V(read_back); a file-backed one V(apply), V(read_back), V(fsync) (and
      V(convert) for qcow2).
  returned: when a backup or restore was done
  type: dict
  sample: {"read": 1.41, "verify": 0.52, "fsync": 0.31}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.volume_backup_module import (
    run_volume_backup,
    volume_backup_argument_spec,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = volume_backup_argument_spec()


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_volume_backup)


if __name__ == "__main__":
    main()
