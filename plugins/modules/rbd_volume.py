#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: rbd_volume
short_description: Manage a Ceph RBD image used as a VM volume, its snapshots and ownership marks
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Creates (empty, or as a clone of a protected template snapshot), resizes, snapshots, exports, imports and
    deletes Ceph RBD images through the C(rbd) command with C(--format json).
  - Ownership marks live in the image's image-meta as C(cloud.zjusct.io/owner) and C(cloud.zjusct.io/claimed-by)
    (the CloudVM uid). A request whose O(owner) or O(claimed_by) differs from the marks is refused.
  - Destructive requests are refused while the image is in use, namely O(state=absent) while the image has watchers
    (an open client such as QEMU, or a stale one — the watcher is named), while snapshots remain (unless
    O(purge_snapshots=true)) or while it is claimed (unless the claim is released in the same task).
  - The plan sees every fact the real run depends on and refuses before any change, in check mode and for real
    alike, naming the blocking objects and what to do. A snapshot with clones (C(rbd children --all), trashed
    clones included) cannot be unprotected or removed, so O(state=absent) and O(snapshot_state=absent) or
    V(unprotected) are refused naming each clone as C(pool/image) (flatten it with C(rbd flatten) or delete it).
    Any change to an image holding a manual lock (C(rbd lock add)) is refused naming the lock (rbd would fail
    with EROFS, or hang on delete). Creating or importing into a missing pool, importing a missing file and
    exporting into a missing directory are refused too.
  - Idempotent; supports check mode (nothing is changed, the planned actions are returned) and diff mode.
extends_documentation_fragment:
  - zjusct.cloud.ceph
options:
  pool:
    description: Pool holding the image.
    type: str
    default: rbd
  name:
    description: Image name (letters, digits, C(_ . + - = :)).
    type: str
    required: true
  state:
    description:
      - V(present) creates the image when missing (from O(size_mib) or O(clone_from)), grows it to O(size_mib),
        sets missing marks and manages O(snapshot).
      - V(absent) deletes the image (see the refusals above).
      - V(resized) changes the size of an existing image to O(size_mib) (shrinking needs O(allow_shrink)).
      - V(exported) writes O(snapshot) to the file O(path) — raw, or an C(rbd diff v1) stream since
        O(from_snapshot). An existing O(path) is left alone unless O(force).
      - V(imported) creates the NEW image from the file O(path) (raw or C(rbd diff v1), detected) and applies the
        diff files O(diffs) in order. Refused if the image exists (unless it was imported from the same files).
    type: str
    choices: [present, absent, resized, exported, imported]
    default: present
  size_mib:
    description: Size in MiB (1 to 67108864). Required to create without O(clone_from).
    type: int
  allow_shrink:
    description:
      - Allow O(size_mib) below the current size (data beyond the new end is lost). Refused while watchers exist.
    type: bool
    default: false
  clone_from:
    description:
      - C(pool/image@snapshot) of a protected template snapshot to clone when the image does not exist.
        An existing image that is a clone of another parent is refused.
    type: str
  snapshot:
    description: Snapshot name to manage (with O(state=present)) or to export (with O(state=exported)).
    type: str
  snapshot_state:
    description: Desired state of O(snapshot) with O(state=present).
    type: str
    choices: [present, absent, protected, unprotected]
    default: present
  from_snapshot:
    description: With O(state=exported), export only the changes since this snapshot (an C(rbd diff v1) stream).
    type: str
  export_format:
    description: With O(state=exported), V(raw) (a plain image file) or V(diff) (C(rbd export-diff) stream).
      Defaults to V(diff) with O(from_snapshot), else V(raw).
    type: str
    choices: [raw, diff]
  path:
    description: File to export to (written as C(<path>.partial), renamed when complete) or to import from.
    type: path
  diffs:
    description: With O(state=imported), C(rbd diff v1) files applied in order after O(path).
    type: list
    elements: path
    default: []
  force:
    description: With O(state=exported), overwrite an existing O(path).
    type: bool
    default: false
  owner:
    description: Owner mark expected on (or set on) the image. Mismatch is refused.
    type: str
  claimed_by:
    description:
      - Claimant (CloudVM uid) expected on (or set on) the image with O(state=present). Claimed by someone else is
        refused. With O(release_claim), the current claimant to release.
    type: str
  release_claim:
    description: Remove the claimed-by mark (it must equal O(claimed_by)); refused while the image has watchers.
    type: bool
    default: false
  purge_snapshots:
    description: With O(state=absent), delete (and unprotect) all snapshots first.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: A 2 GiB root volume owned by alice
  zjusct.cloud.rbd_volume:
    pool: rbd
    name: vm-alice-root
    size_mib: 2048
    owner: alice

- name: Protect a template snapshot, then clone a VM volume from it and claim it
  zjusct.cloud.rbd_volume:
    name: debian-bookworm
    snapshot: v1
    snapshot_state: protected
- zjusct.cloud.rbd_volume:
    name: vm-bob-root
    clone_from: rbd/debian-bookworm@v1
    owner: bob
    claimed_by: 6f1c2d9e-0b7a-4d1e-9a43-1f3c5e7d9b21

- name: Grow it to 4 GiB
  zjusct.cloud.rbd_volume:
    name: vm-bob-root
    state: resized
    size_mib: 4096

- name: Export the changes between two snapshots
  zjusct.cloud.rbd_volume:
    name: vm-bob-root
    state: exported
    snapshot: s2
    from_snapshot: s1
    path: /backup/vm-bob-root.s1-s2.rbdiff

- name: Delete it after the VM is gone (release the claim, purge snapshots)
  zjusct.cloud.rbd_volume:
    name: vm-bob-root
    state: absent
    claimed_by: 6f1c2d9e-0b7a-4d1e-9a43-1f3c5e7d9b21
    release_claim: true
    purge_snapshots: true
    ceph_user: cloud
    ceph_keyring: /etc/ceph/ceph.client.cloud.keyring
"""

RETURN = r"""
image:
  description: The image after the task (before it, in check mode); null when it does not exist.
  returned: always
  type: dict
  contains:
    pool: {description: Pool., type: str, sample: rbd}
    name: {description: Image name., type: str, sample: vm-bob-root}
    id: {description: RBD image id (changes when an image is recreated)., type: str, sample: 10a26b8b4567}
    size_mib: {description: Size in MiB (rounded down)., type: int, sample: 4096}
    size_bytes: {description: Size in bytes., type: int, sample: 4294967296}
    object_size: {description: Object size in bytes., type: int, sample: 4194304}
    features: {description: Enabled image features., type: list, elements: str, sample: [layering, exclusive-lock]}
    parent: {description: "C(pool/image@snapshot) of a clone's parent, else null.", type: str, sample: rbd/debian@v1}
    watchers:
      description: Open clients (C(address), C(client) id). A watcher that outlives its VM is stale (fence it).
      type: list
      elements: dict
      sample: [{address: "127.0.0.1:0/1455377617", client: 4198}]
    locks: {description: Locks as listed by C(rbd lock ls)., type: list, elements: dict, sample: []}
    snapshots:
      description: Snapshots with C(name), C(size_bytes), C(protected), C(timestamp).
      type: list
      elements: dict
      sample: [{name: v1, size_bytes: 2147483648, protected: true, timestamp: "Mon Nov 30 06:39:37 2026"}]
    owner: {description: Owner mark., type: str, sample: bob}
    claimed_by: {description: Claimed-by mark (CloudVM uid)., type: str, sample: 6f1c2d9e-0b7a-4d1e-9a43-1f3c5e7d9b21}
    marks: {description: All C(cloud.zjusct.io/*) image-meta keys., type: dict, sample: {cloud.zjusct.io/owner: bob}}
actions:
  description: The changes made (or, in check mode, planned), in order.
  returned: always
  type: list
  elements: str
  sample: ["clone rbd/debian-bookworm@v1", "meta_set cloud.zjusct.io/owner bob"]
diff:
  description: Before/after summary (exists, size_mib, snapshots, owner, claimed_by) for C(--diff).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import connection_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_volume_module import run_rbd_volume

ARGUMENT_SPEC: dict = dict(
    pool=dict(type="str", default="rbd"),
    name=dict(type="str", required=True),
    state=dict(type="str", default="present", choices=["present", "absent", "resized", "exported", "imported"]),
    size_mib=dict(type="int"),
    allow_shrink=dict(type="bool", default=False),
    clone_from=dict(type="str"),
    snapshot=dict(type="str"),
    snapshot_state=dict(type="str", default="present", choices=["present", "absent", "protected", "unprotected"]),
    from_snapshot=dict(type="str"),
    export_format=dict(type="str", choices=["raw", "diff"]),
    path=dict(type="path"),
    diffs=dict(type="list", elements="path", default=[]),
    force=dict(type="bool", default=False),
    owner=dict(type="str"),
    claimed_by=dict(type="str"),
    release_claim=dict(type="bool", default=False),
    purge_snapshots=dict(type="bool", default=False),
    **connection_argument_spec(),
)
MUTUALLY_EXCLUSIVE = [("clone_from", "path")]


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE, supports_check_mode=True)
    run_module(module, run_rbd_volume)


if __name__ == "__main__":
    main()
