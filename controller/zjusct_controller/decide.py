"""The controller's pure decisions: from a CloudVM, its launcher Pods, their Nodes and its root volume claim,
the actions to take and the status to write. No I/O; the kopf adapter (:mod:`.reconcile`) reads the objects,
calls :func:`decide` and carries the :class:`Plan` out.

Objects are plain dicts in the API's camelCase shape (``ApiClient.sanitize_for_serialization`` of the typed
models, or what ``CustomObjectsApi`` returns). Times are RFC 3339 strings (UTC, ``Z``); sizes MiB; CPU millicores.

The status comes from :func:`model.phase.derive_status` (the same state machine as the host backend): a VM is Running
only while the launcher Pod of ``spec.bootID`` runs *and* its readiness probe (the launcher's ready marker,
written after the guest's SSH banner answered, docs/launcher-protocol.md §2 step 8) has passed.

What the decisions build on lives beside this file: the configuration (:mod:`.config`), the launcher Pod
(:mod:`.pod`), the reading of a Pod (:mod:`.observe`), the root volume (:mod:`.volume`) and refused writes
(:mod:`.refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    OUT_OF_SERVICE_TAINT,
    node_ready,
    out_of_service,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation, Status, derive_status
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import ADMITTED_FIELD, admitted_boot
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import with_defaults

from .config import Config
from .observe import boot_of, moved_away, observe, pod_rbd, releasable, unschedulable
from .pod import POD_FINALIZER, SSH_PORT, launcher_pod, pod_name
from .refusal import REFUSAL_REASONS
from .volume import VolumeProblem, claim_problem, is_block_claim, rbd_root_disk

FINALIZER = "cloud.zjusct.io/launcher"  # the CloudVM's finalizer, removed once none of its launcher Pods is left
# the status reason of a boot whose launcher Pod is evicted (observe.moved_away): it starts again elsewhere
EVICTED = "Evicted"
STOP_OUTCOMES = ("StopRequested", "StopTimeoutKilled")  # LauncherResult reasons of a stop (graceful or by force)


def needs_volume(vm: dict, claim: Optional[dict]) -> bool:
    """True when the adapter must read the claim's PersistentVolume before deciding: the claim is Bound and a
    launcher Pod of ``spec.bootID`` may be created (``powerState`` Running, the VM not being deleted, no Pod of
    this boot recorded in the status, or the boot's Pod was evicted and is created again once gone): its owner mark
    is checked (:func:`.volume.owner_problem`) and, for a Block claim, it names the RBD image
    (:func:`.volume.rbd_root_disk`). Otherwise the PV is not needed (no extra API call)."""
    if ((claim or {}).get("status") or {}).get("phase") != "Bound":
        return False
    spec, prev = with_defaults(vm.get("spec") or {}), vm.get("status") or {}
    if spec["powerState"] != "Running" or (vm.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not (prev.get("bootID") == int(spec["bootID"]) and prev.get("pod")) or being_moved(prev)


def being_moved(status: dict) -> bool:
    """True when ``status`` says the current boot's launcher Pod was evicted (``Stopping/Evicted``): once that Pod is
    gone, the boot's Pod is created again (:func:`decide`, docs/controller.md Drain)."""
    return (status.get("phase"), status.get("reason")) == ("Stopping", EVICTED)


def fence_targets(older: list, nodes: dict, rbd: Optional[dict], cfg: Config) -> tuple[list, str]:
    """Which launcher Pods to fence (older boots before the current boot may start; every boot's when the VM is
    stopped or deleted), and what blocks it.

    A Pod is fenced when it has not ended, is bound to a Node that is not Ready (or is gone) and that Node
    carries :data:`OUT_OF_SERVICE_TAINT`; a gone Node counts as out of service (deleted by the operator). The image
    is the one the Pod's own LauncherConfig names (:func:`.observe.pod_rbd`), else ``rbd``.

    Args:
        older: launcher Pods that must end (older boots, or the current one of a VM stopped or deleted).
        nodes: node name -> Node dict or None.
        rbd: the current boot's ``rootDisk.rbd`` (:func:`.volume.rbd_root_disk`), None when not known or not RBD.
        cfg: the controller config (``ceph.fenceUser``/``fenceKeyring`` = fencing configured).

    Returns:
        ``(targets, note)``: ``targets`` is a list of ``{"pod", "uid", "node", "podIP", "pool", "image"}`` (``podIP``
        None when the Pod never reported one) for :class:`Plan` ``fence``; ``note`` (may be empty) tells the
        operator why a Pod on a lost node is not fenced (no taint, not RBD, fencing not configured).
    """
    targets, notes = [], []
    for p in older:
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            continue
        if observe(p, node_ready(nodes.get(node))).state != "unknown":
            continue
        name = p["metadata"]["name"]
        image = pod_rbd(p) or rbd
        if nodes.get(node) is not None and not out_of_service(nodes[node]):
            notes.append(f"launcher Pod {name} is on node {node}, which is not Ready: once the node is off, taint it "
                         f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute to fence the old boot")
        elif image is None:
            notes.append(f"launcher Pod {name} on the out-of-service node {node} cannot be fenced: the root disk is "
                         "not an RBD image; delete the Pod (--force) once the node is surely off")
        elif cfg.ceph is None or not cfg.ceph.fence_user:
            notes.append(f"launcher Pod {name} on the out-of-service node {node} cannot be fenced: the controller "
                         "config has no ceph.fenceUser/fenceKeyring")
        else:
            targets.append({"pod": name, "uid": p["metadata"].get("uid"), "node": node,
                            "podIP": (p.get("status") or {}).get("podIP") or None,
                            "pool": image["pool"], "image": image["image"]})
    return targets, "; ".join(notes)


def fencing_note(targets: list) -> str:
    """The status message's note on the fences a plan carries (:func:`fence_targets`' targets), "" for none."""
    if not targets:
        return ""
    return "fencing " + ", ".join(f"launcher Pod {t['pod']} on the out-of-service node {t['node']}"
                                  for t in targets) + " (RBD blocklist, then the Pod is removed)"


@dataclass
class Plan:
    """What one reconcile does, in order: finalizer, PVC mark, deletes, create, then the status.

    Attributes:
        add_finalizer / remove_finalizer: the CloudVM's :data:`FINALIZER`.
        mark_claim: annotate the root volume claim with :data:`.volume.CLAIMED_BY` = the VM's uid.
        delete_pods: ``(name, grace_seconds)`` of launcher Pods to delete.
        fence: launcher Pods of older boots on an out-of-service node (:func:`fence_targets`): the adapter
            blocklists their RBD client and only then force-deletes each Pod (grace 0); a failed blocklist leaves
            the Pod, so the new boot stays blocked. Never together with ``create_pod``.
        release_pods: ``(name, uid, finalizers)`` of terminating launcher Pods whose finalizer
            :data:`.pod.POD_FINALIZER` the adapter removes (:func:`.observe.releasable`; ``finalizers`` the Pod's
            list as read, for the patch's test).
        create_pod: the Pod manifest to create, or None.
        status: the full status to write (None: the CloudVM is being deleted and is left as it is).
        refused: the reason (:data:`.refusal.REFUSAL_REASONS`) when a write of this reconcile was refused (set by
            :func:`refuse` and by the adapter): the VM is retried with backoff (:func:`.refusal.retry_delay`).
    """

    add_finalizer: bool = False
    remove_finalizer: bool = False
    mark_claim: bool = False
    delete_pods: list = field(default_factory=list)
    fence: list = field(default_factory=list)
    release_pods: list = field(default_factory=list)
    create_pod: Optional[dict] = None
    status: Optional[dict] = None
    refused: str = ""


def _conditions(prev: list, phase: str, reason: str, message: str, generation: int, now: str) -> list:
    """The Ready condition (True only in Running); lastTransitionTime kept while its status is unchanged."""
    status = "True" if phase == "Running" else "False"
    old = next((c for c in prev or [] if c.get("type") == "Ready"), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get(
        "lastTransitionTime") else now
    return [{"type": "Ready", "status": status, "reason": reason or phase, "message": message[:32768],
             "lastTransitionTime": since, "observedGeneration": generation}]


def decide(vm: dict, pods: list, nodes: dict, claim: Optional[dict], claim_writers: list, cfg: Config,
           now: str, volume: Optional[dict] = None) -> Plan:
    """The next step for one CloudVM.

    Args:
        vm: the CloudVM (with ``metadata.uid``, ``generation``).
        pods: every launcher Pod labelled with this VM (:data:`.pod.LABEL_VM`), any boot.
        nodes: node name -> Node dict (or None when the Node does not exist) for the Pods' nodes and the node
            ``status.node`` names.
        claim: the PVC named by ``spec.rootVolumeClaim`` in the VM's namespace, or None.
        claim_writers: names of Pods not belonging to this VM that mount the claim or name it in their
            :data:`.pod.ROOT_CLAIM` annotation, and have not ended.
        cfg: the launcher defaults.
        now: the current time (RFC 3339), for condition transition times.
        volume: the claim's PersistentVolume when :func:`needs_volume` says it is needed (a Block claim: the RBD
            image, :func:`.volume.rbd_root_disk`), else None.

    Returns:
        A :class:`Plan`. Rules: one launcher Pod per (VM, bootID), created only when ``powerState`` is Running,
        the VM is not being deleted, no Pod of this boot was ever created (``status.pod`` of this boot records
        it), no older boot's launcher may still run or cannot be observed, and the root volume claim is Bound
        and not used by another CloudVM or Pod. Pods of older boots, and the current one when the VM should be
        off or is deleted, are deleted with the grace period that lets the launcher stop the guest. A Pod of
        the current boot deleted by someone else while the VM should run is ``Failed/LauncherLost``, except an
        eviction (:func:`.observe.moved_away`): ``Stopping/Evicted`` while the launcher stops the guest, and once that
        Pod is gone from a node that is Ready, the boot's Pod is created again (the one exception to "never
        twice": the old Pod ended by a graceful stop on a node that answers, so its guest is off).
    """
    md = vm["metadata"]
    spec = with_defaults(vm.get("spec") or {})
    prev = dict(vm.get("status") or {})
    boot = int(spec["bootID"])
    want = spec["powerState"] == "Running"
    deleting = bool(md.get("deletionTimestamp"))
    grace = cfg.grace_period_s
    plan = Plan()

    def obs(p: dict) -> BootObservation:
        n = (p.get("spec") or {}).get("nodeName")
        return observe(p, node_ready(nodes.get(n)) if n else None)

    current_pods = [p for p in pods if boot_of(p) == boot]
    older = sorted((p for p in pods if boot_of(p) != boot), key=lambda p: boot_of(p) or 0)
    cur = current_pods[0] if current_pods else None

    ending = older + ([cur] if cur is not None and (deleting or not want) else [])
    for p in ending:
        # a Pod on a lost node is not deleted: a terminating Pod on an out-of-service node is force-deleted by
        # the pod GC (its finalizer, POD_FINALIZER, keeps it), and a Pod without the finalizer would be gone with
        # the record of the RBD client to fence; it is deleted once its node is back, or after the fence (Plan.fence)
        if not (p.get("metadata") or {}).get("deletionTimestamp") and obs(p).state != "unknown":
            plan.delete_pods.append((p["metadata"]["name"], grace))
    for p in pods:
        pmd = p.get("metadata") or {}
        node_name = (p.get("spec") or {}).get("nodeName")
        if POD_FINALIZER in (pmd.get("finalizers") or []) and releasable(
                p, node_ready(nodes.get(node_name)) if node_name else None):
            plan.release_pods.append((pmd["name"], pmd.get("uid"), list(pmd.get("finalizers") or [])))
    fence_note = ""
    if deleting or not want:  # a stop or a deletion waits on a launcher of an out-of-service node: fence it
        plan.fence, fence_note = fence_targets(ending, nodes, None, cfg)

    if deleting:
        plan.remove_finalizer = not pods and FINALIZER in (md.get("finalizers") or [])
        return plan
    plan.add_finalizer = FINALIZER not in (md.get("finalizers") or [])

    others = tuple(obs(p) for p in older)
    recorded = prev.get("bootID") == boot and bool(prev.get("pod"))  # a Pod of this boot was created before
    # the boot's evicted Pod is gone and its node answers: its guest was stopped, the boot starts again elsewhere
    moving = (recorded and want and cur is None and being_moved(prev)
              and node_ready(nodes.get(str(prev.get("node")))) is True)
    name = pod_name(md["name"], boot)
    extra: dict[str, Any] = {}
    status: Status
    if cur is not None:
        current = obs(cur)
        evicted = moved_away(cur) if want and current.state != "unknown" and (
            current.state != "exited" or (current.result or {}).get("reason") in STOP_OUTCOMES) else None
        being_deleted = want and bool((cur.get("metadata") or {}).get("deletionTimestamp"))
        if being_deleted and current.state not in ("exited", "unknown"):
            current = BootObservation(boot, "lost", started_at=current.started_at, node=current.node,
                                      detail=f"launcher Pod {name} is being deleted while the VM should run")
        elif being_deleted and current.state == "exited":
            result = current.result or {}
            # the outcome of a stop (graceful or by force) that was not ours: someone deleted the Pod
            if result.get("reason") in STOP_OUTCOMES:
                current = BootObservation(boot, "lost", started_at=current.started_at, node=current.node,
                                          detail=f"launcher Pod {name} was deleted while the VM should run")
        status = derive_status(spec, current, others)
        if evicted is not None:
            status = Status("Stopping", EVICTED,
                            f"launcher Pod {name} is evicted from node {current.node} ({evicted}): the guest is "
                            f"stopped, then boot {boot} starts again on a node the scheduler picks", boot,
                            node=current.node, started_at=current.started_at)
        if current.state == "starting" and (status.phase, status.reason) == ("Pending", "Starting"):
            # created (and perhaps bound), its container not started: the status the create wrote stands, so
            # the scheduler's binding costs no status write; the node is recorded once the container runs
            status = Status("Pending", "Starting", f"boot {boot} requested", boot)
        why = unschedulable(cur) if (status.phase, status.reason) == ("Pending", "Starting") else None
        if why is not None:  # the scheduler's verdict, e.g. not enough cloud.zjusct.io/bandwidth-mbps anywhere
            status.reason, status.message = "Unschedulable", f"launcher Pod {name} cannot be scheduled: {why}"
            if spec.get("antiAffinityGroup") and "anti-affinity" in why:
                status.message += (f" (spec.antiAffinityGroup {spec['antiAffinityGroup']!r}: running VMs of owner "
                                   f"{spec['owner']} in this group never share a node)")
        extra["pod"] = name
        pod_ip = (cur.get("status") or {}).get("podIP")
        if status.phase == "Running" and pod_ip:
            extra["sshEndpoint"] = {"host": pod_ip, "port": SSH_PORT}
    elif recorded and not moving:
        extra["pod"] = prev["pod"]
        if prev.get("phase") in ("Stopped", "Failed"):  # the boot ended and was recorded; the Pod is gone since
            status = Status(prev["phase"], prev.get("reason", ""), prev.get("message", ""), boot,
                            node=prev.get("node"), started_at=prev.get("startedAt"),
                            ssh_ready_at=prev.get("sshReadyAt"), exit_result=prev.get("exitResult"))
        elif not want:
            status = Status("Stopped", "StopRequested", f"the launcher Pod of boot {boot} is gone after the stop",
                            boot, node=prev.get("node"), started_at=prev.get("startedAt"))
        else:
            status = derive_status(spec, BootObservation(
                boot, "lost", node=prev.get("node"), started_at=prev.get("startedAt"),
                detail=f"launcher Pod {prev['pod']} of boot {boot} is gone without a result"), others)
    elif want:
        problem, mark, why, rbd = claim_problem(vm, claim, claim_writers, volume, cfg)
        status = derive_status(spec, None, others, volume_writer=problem)
        if status.phase == "Blocked" and status.reason == "VolumeInUse" and problem:  # the claim's own reason
            status.reason, status.message = why, problem
        if status.reason == "PreviousBootRunning":  # an older boot on a lost node: fence it, or say why not
            if rbd is None and claim is not None and is_block_claim(claim) and volume is not None:
                try:  # the image even when the claim is blocked for the old launcher's sake
                    rbd = rbd_root_disk(claim, volume, cfg)
                except VolumeProblem:
                    rbd = None
            plan.fence, note = fence_targets(older, nodes, rbd, cfg)
            note = fencing_note(plan.fence) or note
            if note:
                status.message = f"{status.message}; {note}"
        if status.phase == "Pending":
            plan.mark_claim = mark
            plan.create_pod = launcher_pod(vm, cfg, rbd)
            extra["pod"] = name
    else:
        alive = [o for o in others if o.state in ("alive", "starting", "unknown")]
        if alive:
            status = derive_status(spec, alive[-1], others)
        elif prev.get("phase") in ("Stopped", "Failed") and prev.get("bootID") is not None:
            status = Status(prev["phase"], prev.get("reason", ""), prev.get("message", ""), int(prev["bootID"]),
                            node=prev.get("node"), started_at=prev.get("startedAt"),
                            ssh_ready_at=prev.get("sshReadyAt"), exit_result=prev.get("exitResult"))
            extra.update({k: prev[k] for k in ("pod",) if prev.get(k)})
        else:
            status = derive_status(spec, None, others)
    fence_note = fencing_note(plan.fence) or fence_note
    if fence_note and not want and fence_note not in status.message:  # a kept message may carry it already
        status.message = f"{status.message}; {fence_note}"
    status.extra.update(extra)
    out = status.as_dict()
    admitted = boot if plan.create_pod is not None else admitted_boot(prev)
    if admitted is not None:  # kept in every status: the quota counts the VM from its first admitted boot on
        out[ADMITTED_FIELD] = admitted
    generation = int(md.get("generation") or 0)
    out["observedGeneration"] = generation
    out["message"] = out.get("message", "")[:4096]
    out["conditions"] = _conditions(prev.get("conditions") or [], out["phase"], out["reason"], out["message"],
                                    generation, now)
    plan.status = out
    return plan


def status_patch(prev: dict, new: dict) -> Optional[dict]:
    """The JSON merge patch turning ``prev`` into ``new`` (keys gone become None), or None when equal."""
    if prev == new:
        return None
    patch: dict[str, Any] = {k: v for k, v in new.items() if prev.get(k) != v}
    patch.update({k: None for k in prev if k not in new})
    return patch


def transition_event(prev: dict, new: dict) -> Optional[tuple[str, str, str]]:
    """``(type, reason, message)`` of the Kubernetes Event for a phase or reason change, or None.

    Warning for Failed, Unknown and Blocked and for a refused write (:data:`.refusal.REFUSAL_REASONS`, any phase);
    Normal otherwise. The reason is the new status reason.
    """
    if (prev.get("phase"), prev.get("reason"), prev.get("bootID")) == (
            new.get("phase"), new.get("reason"), new.get("bootID")):
        return None
    kind = "Warning" if new.get("phase") in ("Failed", "Unknown", "Blocked") or new.get(
        "reason") in REFUSAL_REASONS else "Normal"
    message = (f"boot {new.get('bootID')}: {prev.get('phase') or '(none)'} -> {new.get('phase')}: "
               f"{new.get('message', '')}")
    return kind, new.get("reason") or new.get("phase") or "Unknown", message[:1024]


def refuse(vm: dict, plan: Plan, reason: str, message: str, now: str, starting: bool = True) -> Plan:
    """``plan`` after a refusal: no claim mark and no launcher Pod, and a status that says why.

    ``starting`` (the refusal is of the boot's own start: the quota, the claim mark, the Pod, the finalizer of a VM
    about to start):
    phase ``Blocked`` with ``reason``/``message``, no ``pod`` (no Pod of this boot exists, so the next reconcile
    tries again rather than call it lost) and ``admittedBootID`` as before the boot. Otherwise (a delete, the
    finalizer's removal) the phase stays and only the reason and message say what was refused. The Ready condition
    follows.
    """
    md = vm["metadata"]
    prev = dict(vm.get("status") or {})
    out = dict(plan.status if plan.status is not None else prev)
    if starting:
        out["phase"] = "Blocked"
        out.pop("pod", None)
        out.pop("node", None)
        out.pop("sshEndpoint", None)
        admitted = admitted_boot(prev)
        out.pop(ADMITTED_FIELD, None)
        if admitted is not None:
            out[ADMITTED_FIELD] = admitted
    out["reason"], out["message"] = reason, message[:4096]
    out.setdefault("bootID", int(with_defaults(vm.get("spec") or {})["bootID"]))
    out.setdefault("phase", "Pending")
    generation = int(md.get("generation") or 0)
    out["observedGeneration"] = generation
    out["conditions"] = _conditions(prev.get("conditions") or [], out["phase"], reason, out["message"],
                                    generation, now)
    return Plan(add_finalizer=plan.add_finalizer, remove_finalizer=plan.remove_finalizer if not starting else False,
                delete_pods=list(plan.delete_pods), fence=list(plan.fence),
                release_pods=list(plan.release_pods), status=out, refused=reason)
