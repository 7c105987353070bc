# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Backups and restores of a CloudVM's volume on Kubernetes, recorded as Events of that CloudVM
(docs/security.md, "Audit (Kubernetes)").

With the ``event`` option (``namespace``, ``cloudvm``) of ``zjusct.cloud.volume_backup`` / ``rbd_backup``, each
backup (``state: present``) and each restore (``state: restored``) that changed something or failed writes one
core/v1 Event in ``event.namespace``, with the caller's Kubernetes credentials (kubernetes.core's connection
options, then ``K8S_AUTH_*``):

* ``involvedObject`` the CloudVM ``event.cloudvm`` (with its uid when it exists; a restore usually runs before its
  CloudVM is created, then the reference has no uid), ``source.component`` / ``reportingComponent``
  ``zjusct.cloud``, ``action`` ``Backup`` or ``Restore``;
* ``type`` / ``reason``: ``Normal`` ``BackupCompleted`` / ``RestoreCompleted``, ``Warning`` ``BackupFailed`` /
  ``RestoreFailed``;
* ``message`` naming the backup id, the volume, the destination, the actor (the ``actor`` option, else ``owner``,
  else ``operator``) and the owner (and, for a failure, the error); labels ``cloud.zjusct.io/owner`` and
  ``cloud.zjusct.io/backup-id`` and the annotation ``cloud.zjusct.io/actor`` carry the same.

Before anything is done the module asks the API server whether the caller may create Events in that namespace
(a SelfSubjectAccessReview) and refuses otherwise, so no backup is made that cannot be recorded. A failure's Event
is best effort (an Event that cannot be written never hides the failure); a success whose Event cannot be written
fails the task naming the backup made. Verification (``state: verified``) and check mode write no Event. Only
named fields go into an Event, never a connection option.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Dict, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import api_client, auth_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    API_VERSION,
    GROUP,
    KIND,
    OWNER_MARK,
    PLURAL,
    VERSION,
)

COMPONENT = "zjusct.cloud"
# state -> (action, reason when done, reason when failed)
REASONS = {"present": ("Backup", "BackupCompleted", "BackupFailed"),
           "restored": ("Restore", "RestoreCompleted", "RestoreFailed")}
MESSAGE_LIMIT = 1024  # as the controller's Events
BACKUP_ID_LABEL = f"{GROUP}/backup-id"  # beside the owner mark (model.spec.OWNER_MARK) as a label of the Event
ACTOR_ANNOTATION = f"{GROUP}/actor"


def event_argument_spec() -> Dict[str, Any]:
    """The ``event`` option and kubernetes.core's connection options (documented in plugins/modules/volume_backup.py
    and rbd_backup.py)."""
    return dict(
        event=dict(type="dict", options=dict(namespace=dict(type="str", required=True),
                                             cloudvm=dict(type="str", required=True))),
        **auth_argument_spec(),
    )


class BackupEvents:
    """Writes the Events of one backup or restore of the CloudVM ``event.namespace``/``event.cloudvm``.

    Raises:
        CloudError: the API client cannot be built (``event: ...``).
    """

    def __init__(self, params: Dict[str, Any]) -> None:
        from kubernetes.client import AuthorizationV1Api, CoreV1Api, CustomObjectsApi

        event = params["event"]
        self.namespace, self.cloudvm = str(event["namespace"]), str(event["cloudvm"])
        api = api_client(params, lambda message: CloudError(f"event: {message}", field="event"))
        self.core: Any = CoreV1Api(api)
        self.authz: Any = AuthorizationV1Api(api)
        self.custom: Any = CustomObjectsApi(api)
        self.uid: Optional[str] = None

    def check(self) -> None:
        """Refuse (CloudError ``reason: Forbidden``) unless the caller may create Events in the namespace; remember
        the CloudVM's uid when the caller can read it."""
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import ApiException

        try:
            review = self.authz.create_self_subject_access_review({"spec": {"resourceAttributes": {
                "namespace": self.namespace, "verb": "create", "group": "", "resource": "events"}}})
        except ApiException as exc:
            raise CloudError(f"event: cannot ask the API server whether Events may be written in namespace "
                             f"{self.namespace}: {exc.status} {exc.reason}", field="event") from exc
        if not review.status.allowed:
            raise CloudError(f"event: this task's Kubernetes user may not create Events in namespace "
                             f"{self.namespace}, so the {self.cloudvm} backup or restore could not be recorded; "
                             "nothing was done (grant create on events, config/rbac/aggregate-roles.yaml)",
                             field="event", reason="Forbidden")
        try:
            vm = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.cloudvm)
            self.uid = (vm.get("metadata") or {}).get("uid")
        except ApiException as exc:
            if exc.status not in (403, 404):  # not readable or not there (yet): the reference has no uid
                raise CloudError(f"event: cannot read CloudVM {self.namespace}/{self.cloudvm}: {exc.status} "
                                 f"{exc.reason}", field="event") from exc

    def write(self, kind: str, action: str, reason: str, message: str, labels: Dict[str, str],
              actor: str) -> Dict[str, Any]:
        """Create one Event (``kind`` Normal or Warning) and return it as a dict.

        Raises:
            ApiException: the API server refused it.
        """
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        regarding = {"apiVersion": API_VERSION, "kind": KIND, "name": self.cloudvm,
                     "namespace": self.namespace}
        if self.uid:
            regarding["uid"] = self.uid
        body = {"metadata": {"generateName": f"{self.cloudvm}.", "namespace": self.namespace,
                             "labels": labels, "annotations": {ACTOR_ANNOTATION: actor}},
                "involvedObject": regarding, "reason": reason, "message": message[:MESSAGE_LIMIT], "type": kind,
                "action": action, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT}
        created = self.core.create_namespaced_event(self.namespace, body)
        return dict(self.core.api_client.sanitize_for_serialization(created))


def _label(value: Any) -> Optional[str]:
    """``value`` when it is a valid label value, else None (a label is a filter, the message has the value)."""
    text = str(value or "")
    ok = len(text) <= 63 and all(c.isalnum() or c in "-_." for c in text) and text[:1].isalnum() and \
        text[-1:].isalnum()
    return text if ok and text.isascii() else None


def _labels(owner: Any, backup_id: Any) -> Dict[str, str]:
    """The Event's labels: :data:`model.spec.OWNER_MARK` and :data:`BACKUP_ID_LABEL`, each only when its value is a
    valid label value (:func:`_label`)."""
    return {k: v for k, v in ((OWNER_MARK, _label(owner)), (BACKUP_ID_LABEL, _label(backup_id))) if v}


def _what(params: Dict[str, Any], state: str) -> str:
    """The volume backed up (``present``) or restored into (``restored``), as the message names it: ``<pool>/<image>``,
    ``volume <name>`` (a host store volume) or ``<driver>:<absolute path>``."""
    import os

    if state == "present":
        if params.get("volume"):
            return f"volume {params['volume']}"
        if params.get("path"):
            return f"{params.get('driver') or 'file'}:{os.path.abspath(params['path'])}"
        return f"{params.get('pool') or 'rbd'}/{params.get('name')}"
    if params.get("target_volume"):
        return f"volume {params['target_volume']}"
    if params.get("target_path"):
        return f"{params.get('target_driver') or 'file'}:{os.path.abspath(params['target_path'])}"
    return f"{params.get('target_pool') or params.get('pool') or 'rbd'}/{params.get('target_name')}"


def run_with_events(params: Dict[str, Any], body: Callable[[], Dict[str, Any]], check_mode: bool) -> Dict[str, Any]:
    """Run ``body`` (the host body of one backup or restore, ``params["state"]``) and record it as an Event of the
    CloudVM ``params["event"]`` (module docstring); without ``event``, in check mode and for ``state: verified`` it
    is ``body()``.

    Args:
        params: the module parameters (state, event, dest, backup_id, owner, actor, the connection options).
        body: returns the module result (``changed``, ``backup_id``, ``owner``, ``type``...) or raises.
        check_mode: nothing is written.

    Returns:
        ``body()``'s result, with ``event`` (the Event written: namespace, name, reason, type) when one was.

    Raises:
        CloudError: Events may not be written there (before ``body`` runs), or the success's Event could not be
            written (``backup_id`` in the failure); whatever ``body`` raises, after its Warning Event.
    """
    state = params.get("state") or "present"
    if not params.get("event") or check_mode or state not in REASONS:
        return body()
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import ApiException

    action, done, failed = REASONS[state]
    events = BackupEvents(params)
    events.check()
    actor = str(params.get("actor") or params.get("owner") or "operator")
    dest = params.get("dest")
    what = _what(params, state)
    try:
        result = body()
    except Exception as exc:
        owner = str(params.get("owner") or "")
        labels = _labels(owner, params.get("backup_id"))
        if state == "present":
            message = f"backup of {what} into {dest} by {actor} for owner {owner or '(none given)'} failed: {exc}"
        else:
            message = (f"restore of backup {params.get('backup_id') or '(newest)'} from {dest} into {what} by "
                       f"{actor} for owner {owner or '(the backup owner)'} failed: {exc}")
        try:
            events.write("Warning", action, failed, message, labels, actor)
        except ApiException:  # the failure itself is what the task reports
            pass
        raise
    if not result.get("changed"):
        return result
    owner = str(result.get("owner") or params.get("owner") or "")
    backup_id = result.get("backup_id")
    labels = _labels(owner, backup_id)
    if state == "present":
        pruned = list((result.get("retention") or {}).get("deleted") or [])
        message = (f"backup {backup_id} ({result.get('type')}) of {what} into {dest} by {actor} for owner "
                   f"{owner or '(none)'}" + (f"; pruned {', '.join(pruned)}" if pruned else ""))
    else:
        message = f"backup {backup_id} restored into {what} by {actor} for owner {owner or '(none)'}"
    try:
        written = events.write("Normal", action, done, message, labels, actor)
    except ApiException as exc:
        raise CloudError(f"event: {action.lower()} {backup_id} was done, but its Event could not be written in "
                         f"namespace {events.namespace}: {exc.status} {exc.reason}", field="event",
                         backup_id=backup_id) from exc
    md = written.get("metadata") or {}
    return dict(result, event={"namespace": md.get("namespace"), "name": md.get("name"), "reason": done,
                               "type": "Normal"})
