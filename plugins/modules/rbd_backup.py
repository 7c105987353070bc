#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: rbd_backup
short_description: Verified offline backups of a Ceph RBD image into a directory, and restore into a new image
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - V(present) takes one backup of an image that is not in use (no watchers) by a snapshot, an export (full, or only
    the changes since the previous backup's snapshot), a manifest with the size and checksum of each file and a
    checksum per 4 MiB block of the image, verification of the stored file, then a C(complete) marker written
    last. Checksums are CRC32C when the google-crc32c package (with its C extension) is installed where the
    module runs, else sha256; a diff keeps the kind of its chain, so chains begun before CRC32C stay sha256
    until their next full backup. Backups of either kind verify and restore.
  - Then retention keeps O(keep) backups without ever breaking a chain a kept backup needs, and removes
    backup snapshots of the image that are no longer the base of the next diff.
  - One image may be backed up into several destinations (each with its own O(keep)). Each destination owns its
    snapshots, named C(zjusct-backup-<tag>-<id>) where C(tag) is the first 8 hex digits of the sha256
    of O(dest) with symlinks resolved (C(realpath)), and a destination removes only snapshots carrying its tag
    or named in its own manifests, never another destination's diff base. A diff base deleted by hand gives a
    full backup whose RV(reason) names the missing snapshot. Snapshots named C(zjusct-backup-<id>) by earlier
    versions stay usable as diff base and are cleaned up by the destination whose manifest names them.
  - Every backup is stored as C(<dest>/<id>/) with C(data.rbdiff) (an C(rbd export-diff) stream),
    C(manifest.json) and C(complete). A backup interrupted at any point has no C(complete) marker and no
    id-named directory; the next backup removes its leftovers.
  - V(verified) re-reads the files of a backup's chain and checks them against the manifests, naming each
    damaged file and image block. Nothing in Ceph is touched.
  - V(restored) imports the chain into the NEW image O(target_name), checking each file while C(rbd import-diff)
    reads it, then reads the image back and compares every 4 MiB block with the manifest.
    On any mismatch the new image is removed and the task fails naming the block. An existing target is
    refused, unless it was restored from the same backup (unchanged).
  - Each V(present) run makes a new backup, so it always reports changed. Check mode reports the plan only.
  - With O(host_config) (host backend), every backup and restore that changed something or failed is an audit
    record in that host's store (action C(backup) or C(restore), the backup's owner, the actor, the result, the
    backup id, chain and pruned backups; never a connection setting), listed by M(zjusct.cloud.audit_info).
    Verification, an unchanged restore and check mode record nothing. See docs/security.md, "Audit".
  - On Kubernetes, with O(event), each backup and restore that changed something or failed is an Event of the
    CloudVM (C(BackupCompleted), C(BackupFailed), C(RestoreCompleted), C(RestoreFailed)); see O(event).
requirements:
  - google-crc32c >= 1.5 (optional; CRC32C checksums, needed to verify or restore a CRC32C backup)
extends_documentation_fragment:
  - zjusct.cloud.volume_backup
  - zjusct.cloud.ceph
  - zjusct.cloud.host_config
  - zjusct.cloud.backup_event
  - kubernetes.core.k8s_auth_options
options:
  pool:
    description: Pool of the source image (V(present)).
    type: str
    default: rbd
  name:
    description: Source image (V(present)); also used in messages.
    type: str
  dest:
    description: Directory holding this image's backups (created with mode 0700). A local disk or a mounted
      off-site target.
    type: path
    required: true
  full_every:
    description: Maximum chain length (1 to 10000); a full backup is taken when the chain would get longer.
      V(1) makes every backup full.
    type: int
    default: 7
  force_full:
    description: Take a full backup even when a diff is possible.
    type: bool
    default: false
  watcher_grace_seconds:
    description:
      - With O(state=present), seconds to keep re-checking an image that has watchers before refusing. The watch of
        a client that died without closing the image lingers until the OSDs expire it (C(osd_client_watch_timeout),
        30 s by default); a live client such as a running VM is still refused afterwards.
    type: float
    default: 35
  allow_watchers:
    description:
      - Back up an image that is open (crash-consistent only). By default an image with watchers is refused,
        naming the watchers (a running VM, or a stale client that must be fenced).
    type: bool
    default: false
  owner:
    description: Owner recorded in the manifest; must match the image's owner mark when both exist.
      With V(restored), the owner mark set on the new image (default the manifest's owner); an owner other
      than the manifest's is refused unless O(operator=true) (a backup is given only to its owner).
    type: str
  target_pool:
    description: Pool of the new image (V(restored)); defaults to O(pool).
    type: str
  target_name:
    description: The NEW image to restore into (V(restored)).
    type: str
  keep_snapshots:
    description: With V(restored), keep the backup snapshots that import creates on the new image.
    type: bool
    default: false
  actor:
    description:
      - Who acts, for the audit record written with O(host_config) and the Event written with O(event) (the
        launching user under AWX). Defaults to O(owner), else C(operator).
    type: str
  operator:
    description:
      - The operator switch (docs/security.md) - with V(restored), lets O(owner) differ from the backup's owner
        (an operator hands a disk to another owner); recorded in the audit record written with O(host_config).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Back up the stopped VM's root volume, keep 7
  zjusct.cloud.rbd_backup:
    pool: rbd
    name: vm-alice-root
    dest: /srv/backup/vm-alice
    vm: alice
    owner: alice
    keep: 7
  register: bk

- name: On the host backend, the same backup recorded in the host store's audit trail (audit_info lists it)
  zjusct.cloud.rbd_backup:
    pool: rbd
    name: vm-alice-root
    dest: /srv/backup/vm-alice
    owner: alice
    host_config: /etc/zjusct-cloud/host.json
    actor: alice

- name: Verify the newest backup
  zjusct.cloud.rbd_backup:
    state: verified
    dest: /srv/backup/vm-alice

- name: Restore it into a new image
  zjusct.cloud.rbd_backup:
    state: restored
    dest: /srv/backup/vm-alice
    backup_id: "{{ bk.backup_id }}"
    target_name: vm-alice-root-restored
"""

RETURN = r"""
owner:
  description: The backup's owner (V(present), from O(owner) or the image's owner mark) or the owner mark set on the
    restored image (V(restored)); null when there is none.
  returned: when a backup or restore was done
  type: str
  sample: alice
backup_id:
  description: Id of the backup made, verified or restored (C(YYYYmmddTHHMMSSZ-xxxxxx)).
  returned: success
  type: str
  sample: 20261130T064323Z-a904c0
type:
  description: V(full) or V(diff) (state V(present)).
  returned: state=present
  type: str
  sample: diff
reason:
  description: Why full or diff was chosen.
  returned: state=present
  type: str
  sample: diff since backup 20261130T064320Z-d2e385 (snapshot zjusct-backup-5d41402a-20261130T064320Z-d2e385)
dest_tag:
  description: This destination's tag in the names of the snapshots it creates (see the description).
  returned: state=present
  type: str
  sample: 5d41402a
snapshot:
  description: The source-image snapshot this backup was taken from (C(zjusct-backup-<dest_tag>-<backup_id>)).
  returned: state=present and not check mode
  type: str
  sample: zjusct-backup-5d41402a-20261130T064323Z-a904c0
chain:
  description: Backup ids from the full backup to this one.
  returned: success
  type: list
  elements: str
bytes_written:
  description: Size in bytes of the stored data file.
  returned: state=present and not check mode
  type: int
image_size_bytes:
  description: Size in bytes of the image at the backup snapshot.
  returned: success
  type: int
retention:
  description: C(keep), C(deleted), C(kept_for_chain) backup ids.
  returned: state=present with keep
  type: dict
removed_snapshots:
  description: This destination's backup snapshots removed from the source image (no longer its diff base).
  returned: state=present and not check mode
  type: list
  elements: str
problems:
  description: Verification failures, each naming the backup, file or image block and the byte range.
  returned: failure of verified or restored
  type: list
  elements: str
image:
  description: C(pool/name) of the restored image.
  returned: state=restored
  type: str
verified_blocks:
  description: Number of 4 MiB blocks read back and matched (state V(restored)).
  returned: state=restored
  type: int
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
    - Seconds spent in each phase of the operation (where the time goes; docs/benchmarks.md).
    - A backup reports V(export) (streaming C(rbd export-diff) into the stored file), V(verify) (re-reading the
      stored file against the block hashes) and V(fsync) (flushing the stored file, overlapped with the verify).
    - A restore reports V(import) (C(rbd import-diff)) and V(read_back) (reading the new image back against the
      manifest's block hashes).
  returned: when a backup or restore was done
  type: dict
  sample: {"export": 1.41, "verify": 0.52, "fsync": 0.31}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.rbd_backup_module import (
    rbd_backup_argument_spec,
    run_rbd_backup,
)

ARGUMENT_SPEC: dict = rbd_backup_argument_spec()
REQUIRED_IF = [("state", "present", ["name"]), ("state", "restored", ["target_name"])]


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    run_module(module, run_rbd_backup)


if __name__ == "__main__":
    main()
