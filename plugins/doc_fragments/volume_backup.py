# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the options zjusct.cloud.volume_backup and zjusct.cloud.rbd_backup document alike (their
one argument spec: module_utils/host/backup.py, backup_argument_spec). The options whose text differs (the RBD-only
module says image where the general one says volume) stay in each module, as do RETURN, which Ansible does not
take from fragments."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  state:
    description: V(present) backs up, V(verified) checks a stored backup, V(restored) restores one.
    type: str
    choices: [present, verified, restored]
    default: present
  keep:
    description: Number of newest backups to keep (1 to 10000); older ones not needed by a kept chain are deleted.
      Unset keeps everything.
    type: int
  vm:
    description: VM name recorded in the manifest.
    type: str
  backup_id:
    description: Backup to verify or restore (default the newest complete backup in O(dest)).
    type: str
  verify:
    description: With V(present), re-read the stored file and check its checksum before marking the backup
      complete.
    type: bool
    default: true
"""
