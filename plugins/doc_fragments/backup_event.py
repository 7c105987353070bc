# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the Kubernetes Event that records a backup or restore (volume_backup, rbd_backup)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  event:
    description:
      - Kubernetes backend - record this backup or restore as a core/v1 Event of the CloudVM O(event.namespace)/
        O(event.cloudvm), written with this task's Kubernetes credentials (the kubernetes.core connection options
        below, then their C(K8S_AUTH_*) environment fallbacks).
      - "A backup (V(present)) or restore (V(restored)) that changed something is a V(Normal) Event with reason
        C(BackupCompleted) or C(RestoreCompleted), one that failed a V(Warning) Event C(BackupFailed) or
        C(RestoreFailed) (the task still fails with its own error); the message names the backup id, the volume,
        the destination, the actor (O(actor), else O(owner), else C(operator)) and the owner, the labels
        C(cloud.zjusct.io/owner) and C(cloud.zjusct.io/backup-id) and the annotation C(cloud.zjusct.io/actor)
        carry the same; C(reportingComponent) is C(zjusct.cloud). The CloudVM's uid is in C(involvedObject) when
        it exists (a restore usually runs before its CloudVM is made)."
      - Before anything is done the task asks the API server whether it may create Events in O(event.namespace)
        and fails otherwise (C(reason=Forbidden)), so no backup is made that cannot be recorded. A success whose
        Event cannot be written fails naming the backup made.
      - Listed with C(kubectl get events -n <namespace> --field-selector involvedObject.name=<cloudvm>) (or
        M(kubernetes.core.k8s_info) C(kind=Event)). Verification (V(verified)), an unchanged restore and check
        mode write no Event. See docs/security.md, "Audit (Kubernetes)".
    type: dict
    suboptions:
      namespace:
        description: Namespace of the CloudVM (and of the Event).
        type: str
        required: true
      cloudvm:
        description: Name of the CloudVM the Event is about.
        type: str
        required: true
"""
