# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Connection options shared by the RBD modules (rbd_volume, rbd_backup)."""

    DOCUMENTATION = r"""
options:
  ceph_conf:
    description:
      - Path of the ceph.conf naming the monitors (C(rbd --conf)).
      - Falls back to the E(CEPH_CONF) environment variable, then to Ceph's default search path.
      - E(CEPH_ARGS) in the environment is honoured by the rbd tool as usual.
    type: path
  ceph_cluster:
    description: Cluster name (C(rbd --cluster)); falls back to E(CEPH_CLUSTER), then C(ceph).
    type: str
  ceph_user:
    description: Client id without the C(client.) prefix (C(rbd --id)); falls back to E(CEPH_USER), then C(admin).
    type: str
    aliases: [ceph_id]
  ceph_keyring:
    description:
      - Path of the keyring file of O(ceph_user) (C(rbd --keyring)). Only the path is used; the module never
        reads, logs or returns the keyring's contents. Falls back to E(CEPH_KEYRING).
    type: path
  ceph_key:
    description:
      - The cephx secret of O(ceph_user), for when no keyring file exists on the node. It is written to a
        private temporary file passed as C(--keyfile) for each call (never on a command line) and removed
        afterwards; it is never logged or returned. Falls back to E(CEPH_KEY).
    type: str
  timeout:
    description:
      - Seconds allowed for each rbd call (export and import of large images included); the call is killed
        and the task fails when exceeded.
    type: float
    default: 120
requirements:
  - The C(rbd) command (Debian/Ubuntu package C(ceph-common)) on the managed node.
notes:
  - Every rbd call runs with an argument list, C(LC_ALL=C) and O(timeout).
"""
