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

from collections.abc import Callable, Sequence
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
from .volume import ClaimUse, VolumeProblem, claim_use, is_block_claim, rbd_root_disk, used_by_pods

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


@dataclass(frozen=True)
class _Seen:
    """What the steps of :func:`decide` read: the CloudVM and its launcher Pods split by boot.

    Attributes:
        vm: the CloudVM as read; ``md`` its metadata, ``spec`` its spec with defaults, ``prev`` its status.
        boot: ``spec.bootID``.
        want: ``spec.powerState`` is Running.
        deleting: the CloudVM is being deleted (``metadata.deletionTimestamp``).
        current: the launcher Pod of ``boot`` (the first one), or None.
        older: the launcher Pods of other boots, by bootID.
        nodes, cfg: as :func:`decide` got them.
    """

    vm: dict
    md: dict
    spec: dict
    prev: dict
    boot: int
    want: bool
    deleting: bool
    current: Optional[dict]
    older: list
    nodes: dict
    cfg: Config

    @classmethod
    def of(cls, vm: dict, pods: list, nodes: dict, cfg: Config) -> _Seen:
        spec = with_defaults(vm.get("spec") or {})
        boot = int(spec["bootID"])
        current = [p for p in pods if boot_of(p) == boot]
        return cls(vm=vm, md=vm["metadata"], spec=spec, prev=dict(vm.get("status") or {}), boot=boot,
                   want=spec["powerState"] == "Running", deleting=bool(vm["metadata"].get("deletionTimestamp")),
                   current=current[0] if current else None,
                   older=sorted((p for p in pods if boot_of(p) != boot), key=lambda p: boot_of(p) or 0),
                   nodes=nodes, cfg=cfg)

    @property
    def name(self) -> str:
        """The launcher Pod name of ``boot``."""
        return pod_name(self.md["name"], self.boot)

    def ready(self, pod: dict) -> Optional[bool]:
        """:func:`model.lifecycle.node_ready` of the Node ``pod`` is bound to; None when it is not bound."""
        node = (pod.get("spec") or {}).get("nodeName")
        return node_ready(self.nodes.get(node)) if node else None

    def obs(self, pod: dict) -> BootObservation:
        """:func:`.observe.observe` of one launcher Pod."""
        return observe(pod, self.ready(pod))

    @property
    def others(self) -> tuple[BootObservation, ...]:
        """The observations of the older boots' Pods."""
        return tuple(self.obs(p) for p in self.older)

    @property
    def ending(self) -> list:
        """The Pods that must end: the older boots', and the current one when the VM should be off or is deleted."""
        return self.older + ([self.current] if self.current is not None and (self.deleting or not self.want) else [])

    @property
    def recorded(self) -> bool:
        """A Pod of this boot was created before (the status names it)."""
        return self.prev.get("bootID") == self.boot and bool(self.prev.get("pod"))

    @property
    def moving(self) -> bool:
        """The boot's evicted Pod is gone and its node answers: its guest was stopped, the boot starts again
        elsewhere."""
        return (self.recorded and self.want and self.current is None and being_moved(self.prev)
                and node_ready(self.nodes.get(str(self.prev.get("node")))) is True)


def _deletions(seen: _Seen) -> list[tuple[str, int]]:
    """``(name, grace seconds)`` of the Pods that must end (:attr:`_Seen.ending`) and are not terminating yet.

    A Pod on a lost node is not deleted: a terminating Pod on an out-of-service node is force-deleted by the pod GC
    (its finalizer, :data:`.pod.POD_FINALIZER`, keeps it), and a Pod without the finalizer would be gone with the
    record of the RBD client to fence; it is deleted once its node is back, or after the fence (:attr:`Plan.fence`).
    """
    return [(p["metadata"]["name"], seen.cfg.grace_period_s) for p in seen.ending
            if not (p.get("metadata") or {}).get("deletionTimestamp") and seen.obs(p).state != "unknown"]


def _releases(seen: _Seen, pods: list) -> list[tuple[str, Optional[str], list]]:
    """``(name, uid, finalizers)`` of the Pods whose finalizer :data:`.pod.POD_FINALIZER` may go
    (:func:`.observe.releasable`)."""
    out = []
    for p in pods:
        pmd = p.get("metadata") or {}
        finalizers = list(pmd.get("finalizers") or [])
        if POD_FINALIZER in finalizers and releasable(p, seen.ready(p)):
            out.append((pmd["name"], pmd.get("uid"), finalizers))
    return out


def _ends_by_stop(observed: BootObservation) -> bool:
    """True when a deletion of the Pod stops its launcher or did: it runs or starts, or it ended by a stop
    (:data:`STOP_OUTCOMES`). False when its node cannot be observed or its launcher ended with another result."""
    if observed.state == "unknown":
        return False
    return observed.state != "exited" or (observed.result or {}).get("reason") in STOP_OUTCOMES


def _with_pod(seen: _Seen, pod: dict) -> tuple[Status, dict]:
    """The status while the boot's launcher Pod ``pod`` exists, and the status keys ``pod`` and ``sshEndpoint``.

    Someone else's deletion of the Pod while the VM should run is a lost launcher (``Failed/LauncherLost``), except
    an eviction (:func:`.observe.moved_away`): ``Stopping/Evicted``.
    """
    observed = seen.obs(pod)
    by_stop = seen.want and _ends_by_stop(observed)
    evicted = moved_away(pod) if by_stop else None
    if by_stop and (pod.get("metadata") or {}).get("deletionTimestamp"):
        verb = "was deleted" if observed.state == "exited" else "is being deleted"
        observed = BootObservation(seen.boot, "lost", started_at=observed.started_at, node=observed.node,
                                   detail=f"launcher Pod {seen.name} {verb} while the VM should run")
    status = derive_status(seen.spec, observed, seen.others)
    if evicted is not None:
        status = Status("Stopping", EVICTED,
                        f"launcher Pod {seen.name} is evicted from node {observed.node} ({evicted}): the guest is "
                        f"stopped, then boot {seen.boot} starts again on a node the scheduler picks", seen.boot,
                        node=observed.node, started_at=observed.started_at)
    elif (status.phase, status.reason) == ("Pending", "Starting"):
        status = _not_started(seen, pod, observed, status)
    extra: dict[str, Any] = {"pod": seen.name}
    pod_ip = (pod.get("status") or {}).get("podIP")
    if status.phase == "Running" and pod_ip:
        extra["sshEndpoint"] = {"host": pod_ip, "port": SSH_PORT}
    return status, extra


def _not_started(seen: _Seen, pod: dict, observed: BootObservation, status: Status) -> Status:
    """``Pending/Starting`` while the boot's Pod has not started its container, with the scheduler's verdict when
    it cannot place the Pod (``Pending/Unschedulable``, e.g. not enough cloud.zjusct.io/bandwidth-mbps anywhere)."""
    if observed.state == "starting":
        # created (and perhaps bound), its container not started: the status the create wrote stands, so the
        # scheduler's binding costs no status write; the node is recorded once the container runs
        status = Status("Pending", "Starting", f"boot {seen.boot} requested", seen.boot)
    why = unschedulable(pod)
    if why is not None:
        status.reason, status.message = "Unschedulable", f"launcher Pod {seen.name} cannot be scheduled: {why}"
        group = seen.spec.get("antiAffinityGroup")
        if group and "anti-affinity" in why:
            status.message += (f" (spec.antiAffinityGroup {group!r}: running VMs of owner {seen.spec['owner']} "
                               "in this group never share a node)")
    return status


def _as_recorded(prev: dict) -> Status:
    """The ended boot the status ``prev`` records (``Stopped`` or ``Failed``), as it is."""
    return Status(prev["phase"], prev.get("reason", ""), prev.get("message", ""), int(prev["bootID"]),
                  node=prev.get("node"), started_at=prev.get("startedAt"), ssh_ready_at=prev.get("sshReadyAt"),
                  exit_result=prev.get("exitResult"))


def _pod_gone(seen: _Seen) -> tuple[Status, dict]:
    """The status once the boot's launcher Pod, which the status records, is gone: the boot's end as recorded, the
    end of a stop, or a lost launcher (gone without a result while the VM should run)."""
    prev = seen.prev
    extra = {"pod": prev["pod"]}
    if prev.get("phase") in ("Stopped", "Failed"):  # the boot ended and was recorded; the Pod is gone since
        return _as_recorded(prev), extra
    if not seen.want:
        return Status("Stopped", "StopRequested", f"the launcher Pod of boot {seen.boot} is gone after the stop",
                      seen.boot, node=prev.get("node"), started_at=prev.get("startedAt")), extra
    lost = BootObservation(seen.boot, "lost", node=prev.get("node"), started_at=prev.get("startedAt"),
                           detail=f"launcher Pod {prev['pod']} of boot {seen.boot} is gone without a result")
    return derive_status(seen.spec, lost, seen.others), extra


def _off(seen: _Seen) -> tuple[Status, dict]:
    """The status of a VM that should be off and has no Pod of its boot: an older boot still alive, the last
    boot's end as recorded, or none ever ran."""
    others, prev = seen.others, seen.prev
    alive = [o for o in others if o.state in ("alive", "starting", "unknown")]
    if alive:
        return derive_status(seen.spec, alive[-1], others), {}
    if prev.get("phase") in ("Stopped", "Failed") and prev.get("bootID") is not None:
        return _as_recorded(prev), ({"pod": prev["pod"]} if prev.get("pod") else {})
    return derive_status(seen.spec, None, others), {}


def _start(seen: _Seen, plan: Plan, claim: Optional[dict], claim_writers: Callable[[], Sequence[str]],
           volume: Optional[dict]) -> tuple[Status, dict]:
    """The status of a boot to start, no Pod of which exists: ``Pending`` with the launcher Pod to create (and the
    claim mark to write) set on ``plan``, or ``Blocked`` by an older boot's launcher (fenced when its node is out
    of service: ``plan.fence``) or by the root volume claim (:func:`_claim_verdict`)."""
    status, use = _claim_verdict(seen, claim, claim_writers, volume)
    if status.reason == "PreviousBootRunning":
        plan.fence, status.message = _fence_older(seen, claim, volume, use.rbd, status.message)
    if status.phase != "Pending":
        return status, {}
    plan.mark_claim = use.mark
    plan.create_pod = launcher_pod(seen.vm, seen.cfg, use.rbd)
    return status, {"pod": seen.name}


def _claim_verdict(seen: _Seen, claim: Optional[dict], claim_writers: Callable[[], Sequence[str]],
                   volume: Optional[dict]) -> tuple[Status, ClaimUse]:
    """The status of a boot to start as its older boots and its root volume claim allow it, and the claim's
    verdict. The claim's other users (``claim_writers()``) are asked for once, and only when nothing else holds the
    boot back: only then would a Pod be created."""
    others = seen.others
    use = claim_use(seen.vm, claim, volume, seen.cfg)
    status = derive_status(seen.spec, None, others, volume_writer=use.problem)
    if status.phase == "Pending":
        in_use = used_by_pods(seen.spec["rootVolumeClaim"], claim_writers())
        if in_use.problem is not None:
            use, status = in_use, derive_status(seen.spec, None, others, volume_writer=in_use.problem)
    if status.phase == "Blocked" and status.reason == "VolumeInUse" and use.problem:  # the claim's own reason
        status.reason, status.message = use.reason, use.problem
    return status, use


def _fence_older(seen: _Seen, claim: Optional[dict], volume: Optional[dict], rbd: Optional[dict], message: str,
                 ) -> tuple[list, str]:
    """``(targets, message)`` when an older boot's launcher blocks the start: the fence of those on an
    out-of-service node (:func:`fence_targets`), and ``message`` with what is fenced or why not."""
    if rbd is None and claim is not None and is_block_claim(claim) and volume is not None:
        try:  # the image even when the claim is blocked for the old launcher's sake
            rbd = rbd_root_disk(claim, volume, seen.cfg)
        except VolumeProblem:
            rbd = None
    targets, note = fence_targets(seen.older, seen.nodes, rbd, seen.cfg)
    note = fencing_note(targets) or note
    return targets, (f"{message}; {note}" if note else message)


def _status_of(seen: _Seen, plan: Plan, claim: Optional[dict], claim_writers: Callable[[], Sequence[str]],
               volume: Optional[dict]) -> tuple[Status, dict]:
    """The status of a VM not being deleted, by what exists of its boot: its Pod, a record of a Pod now gone, a
    boot to start, or nothing while the VM should be off."""
    if seen.current is not None:
        return _with_pod(seen, seen.current)
    if seen.recorded and not seen.moving:
        return _pod_gone(seen)
    if seen.want:
        return _start(seen, plan, claim, claim_writers, volume)
    return _off(seen)


def _status_doc(seen: _Seen, plan: Plan, status: Status, extra: dict, fence_note: str, now: str) -> dict:
    """The status to write: ``status`` with ``extra``, the note of a stop's fence, the admitted boot,
    ``observedGeneration`` and the Ready condition."""
    fence_note = fencing_note(plan.fence) or fence_note
    if fence_note and not seen.want and fence_note not in status.message:  # a kept message may carry it already
        status.message = f"{status.message}; {fence_note}"
    status.extra.update(extra)
    out = status.as_dict()
    admitted = seen.boot if plan.create_pod is not None else admitted_boot(seen.prev)
    if admitted is not None:  # kept in every status: the quota counts the VM from its first admitted boot on
        out[ADMITTED_FIELD] = admitted
    generation = int(seen.md.get("generation") or 0)
    out["observedGeneration"] = generation
    out["message"] = out.get("message", "")[:4096]
    out["conditions"] = _conditions(seen.prev.get("conditions") or [], out["phase"], out["reason"], out["message"],
                                    generation, now)
    return out


def decide(vm: dict, pods: list, nodes: dict, claim: Optional[dict], claim_writers: Callable[[], Sequence[str]],
           cfg: Config, now: str, volume: Optional[dict] = None) -> Plan:
    """The next step for one CloudVM.

    Args:
        vm: the CloudVM (with ``metadata.uid``, ``generation``).
        pods: every launcher Pod labelled with this VM (:data:`.pod.LABEL_VM`), any boot.
        nodes: node name -> Node dict (or None when the Node does not exist) for the Pods' nodes and the node
            ``status.node`` names.
        claim: the PVC named by ``spec.rootVolumeClaim`` in the VM's namespace, or None.
        claim_writers: the lookup of the names of Pods not belonging to this VM that mount the claim or name it
            in their :data:`.pod.ROOT_CLAIM` annotation and have not ended; called at most once, and only when a
            launcher Pod would be created otherwise (the adapter's lookup may then cost a read).
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
    seen = _Seen.of(vm, pods, nodes, cfg)
    finalizers = seen.md.get("finalizers") or []
    plan = Plan(delete_pods=_deletions(seen), release_pods=_releases(seen, pods))
    fence_note = ""
    if seen.deleting or not seen.want:  # a stop or a deletion waits on a launcher of an out-of-service node: fence it
        plan.fence, fence_note = fence_targets(seen.ending, nodes, None, cfg)
    if seen.deleting:
        plan.remove_finalizer = not pods and FINALIZER in finalizers
        return plan
    plan.add_finalizer = FINALIZER not in finalizers
    status, extra = _status_of(seen, plan, claim, claim_writers, volume)
    plan.status = _status_doc(seen, plan, status, extra, fence_note, now)
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
