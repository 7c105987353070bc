# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.root_volume_claim``: a CloudVM's RBD root volume on Kubernetes (the RBD clone, the
PersistentVolume naming it and the claim bound to it).

What the controller reads (docs/controller.md "Root disk", ``decide.rbd_root_disk``): a ``volumeMode: Block``
PersistentVolumeClaim bound (``spec.volumeName``) to a PersistentVolume whose ``spec.claimRef`` is that claim and
whose ``spec.csi`` names the image as Ceph-CSI does (driver ``rbd.csi.ceph.com``, ``volumeHandle`` ``pool/image``,
``volumeAttributes`` ``{pool, imageName}``). No CSI driver runs; the PV is created here, pre-bound.

Names (docs/naming.md): the RBD image and the PV (cluster-scoped) are both ``<namespace>.<claim>`` fitted to 128
characters (:func:`k8s.root_volume.derived_name`; the controller's limit for ``imageName``). A namespace is a
DNS label and has no ``.``, so ``<namespace>.<claim>`` names one claim only. The image is a clone of the image
set's template ``<pool>/tmpl-<image set>@base`` (:func:`storage.rbd_clone.ensure_template`, the host backend's
RBD driver does the same).

Owner marks: the image-meta ``cloud.zjusct.io/owner`` on the image, the label ``cloud.zjusct.io/owner`` on the PV
and on the claim. An object that exists with another (or no) owner mark, a PV bound to another claim or naming
another image, or a claim bound to another PV is refused before anything is created, naming the object and the
field (:func:`plan`). Objects this run created are removed again when a later step fails. The controller's claim
mark (annotation ``cloud.zjusct.io/claimed-by`` on the claim) of a CloudVM that was deleted is removed, so the
owner's next CloudVM can use the kept volume (the host backend's stale-claim release); the mark of a CloudVM that
exists is left alone.

Shapes: ``p`` is the module's parameter dict; Kubernetes objects are plain dicts as the API returns them.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.root_volume import (
    IMAGE_NAME_MAX,
    OWNER_LABEL,
    RBD_DRIVER,
    ClaimRefused,
    CoreApi,
    derived_name,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.root_volume import claim_mark as _claim_mark
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.root_volume import owner_of as _owner_of
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem, vm_option_claim
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import (
    META_OWNER,
    Connection,
    ImageRef,
    MiB,
    Rbd,
    RbdError,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_clone import (
    TEMPLATE_SNAPSHOT,
    ensure_template,
    template_ref,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError, resolve_image

POLL_INTERVAL = 0.5  # seconds between GETs while waiting for Bound
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # RFC 1123 subdomain (Kubernetes names)


def quantity_mib(size_bytes: int) -> str:
    """A Kubernetes quantity for an image of ``size_bytes`` (rounded down to MiB): ``"2048Mi"``."""
    return f"{int(size_bytes) // MiB}Mi"


def pv_body(pv: str, namespace: str, claim: str, ref: ImageRef, size_bytes: int, owner: str) -> dict:
    """The pre-bound RBD PersistentVolume (Retain, Block, no storage class) naming ``ref``."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv, "labels": {OWNER_LABEL: owner}},
        "spec": {"capacity": {"storage": quantity_mib(size_bytes)}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "", "volumeMode": "Block", "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace,
                              "name": claim},
                 "csi": {"driver": RBD_DRIVER, "volumeHandle": ref.spec,
                         "volumeAttributes": {"pool": ref.pool, "imageName": ref.image}}},
    }


def pvc_body(namespace: str, claim: str, pv: str, size_bytes: int, owner: str) -> dict:
    """The Block claim bound to ``pv`` by ``spec.volumeName``."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, "labels": {OWNER_LABEL: owner}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": "Block",
                 "volumeName": pv, "resources": {"requests": {"storage": quantity_mib(size_bytes)}}},
    }


@dataclass
class Observed:
    """What exists: the RBD image (``size`` bytes and ``meta``, or None), whether its pool exists, the template
    snapshot's size (bytes, None when the template is not ready), the PV and the claim (dicts or None), and the
    CloudVM (``ns/name``) whose uid the claim's mark :data:`CLAIMED_BY` holds, None when no CloudVM has it."""

    image: Optional[dict]
    pool_exists: bool = True
    template_size: Optional[int] = None
    pv: Optional[dict] = None
    pvc: Optional[dict] = None
    image_set: Optional[dict] = field(default=None)
    claim_holder: Optional[str] = None  # ``ns/name`` of the live CloudVM whose uid the claim mark holds


def plan(p: dict, obs: Observed) -> list[str]:
    """The actions that make the root volume of claim ``p['namespace']/p['name']`` exist for ``p['owner']``. Pure.

    Returns:
        actions in order, among ``import template <spec>``, ``clone <template> <image>``, ``resize <image>
        <MiB>``, ``set image-meta cloud.zjusct.io/owner``, ``create PersistentVolume <pv>``, ``create
        PersistentVolumeClaim <ns>/<claim>``, ``release the claim mark ...`` (the controller's :data:`CLAIMED_BY`
        annotation holds the uid of a CloudVM that no longer exists: the CloudVM's finalizer let it go only after its
        last launcher Pod had ended, so nothing it started writes the volume; the controller marks it again for
        the next CloudVM) (empty: everything is there).

    Raises:
        ClaimRefused: an object exists with another owner mark, the PV is bound to another claim or names another
            image, the claim is bound to another PV or is not Block, the PV names an image that is missing, the pool
            is missing, no image set was given for a missing image, or ``size_mib`` is below the image's size. The
            message names the object and the field.
    """
    ns, claim, owner = p["namespace"], p["name"], p["owner"]
    ref = ImageRef(p["pool"], p["rbd_image"])
    pv_name = p["volume_name"]
    errors = []
    if obs.image is not None:
        mark = (obs.image.get("meta") or {}).get(META_OWNER)
        if mark != owner:
            errors.append(f"RBD image {ref.spec}: image-meta {META_OWNER} is {mark or '(none)'}, not {owner}")
    if obs.pv is not None:
        spec = obs.pv.get("spec") or {}
        if _owner_of(obs.pv) != owner:
            errors.append(f"PersistentVolume {pv_name}: metadata.labels[{OWNER_LABEL}] is {_owner_of(obs.pv)}, "
                          f"not {owner}")
        cref = spec.get("claimRef") or {}
        if (cref.get("namespace"), cref.get("name")) != (ns, claim):
            errors.append(f"PersistentVolume {pv_name}: spec.claimRef is {cref.get('namespace')}/{cref.get('name')}"
                          f", not {ns}/{claim}")
        csi = spec.get("csi") or {}
        attrs = csi.get("volumeAttributes") or {}
        if csi.get("driver") != RBD_DRIVER or (attrs.get("pool"), attrs.get("imageName")) != (ref.pool, ref.image):
            errors.append(f"PersistentVolume {pv_name}: spec.csi names {csi.get('driver') or '(no driver)'} "
                          f"{attrs.get('pool')}/{attrs.get('imageName')}, not {RBD_DRIVER} {ref.spec}")
        elif obs.image is None:
            errors.append(f"PersistentVolume {pv_name}: spec.csi names RBD image {ref.spec}, which does not exist;"
                          " delete the PersistentVolume or restore the image")
    if obs.pvc is not None:
        spec = obs.pvc.get("spec") or {}
        if _owner_of(obs.pvc) != owner:
            errors.append(f"PersistentVolumeClaim {ns}/{claim}: metadata.labels[{OWNER_LABEL}] is "
                          f"{_owner_of(obs.pvc)}, not {owner}")
        if spec.get("volumeName") != pv_name:
            errors.append(f"PersistentVolumeClaim {ns}/{claim}: spec.volumeName is {spec.get('volumeName') or '(none)'}"
                          f", not {pv_name}")
        if spec.get("volumeMode") != "Block":
            errors.append(f"PersistentVolumeClaim {ns}/{claim}: spec.volumeMode is "
                          f"{spec.get('volumeMode') or 'Filesystem'}, an RBD root volume needs Block")
    if errors:
        raise ClaimRefused("; ".join(errors))
    acts: list[str] = []
    if obs.image is None:
        if not obs.pool_exists:
            raise ClaimRefused(f"pool: {ref.pool!r} does not exist; create it first (ceph osd pool create "
                               f"{ref.pool}; rbd pool init {ref.pool})")
        if obs.image_set is None:
            raise ClaimRefused(f"image: required to create the RBD image {ref.spec} of claim {ns}/{claim}, which "
                               "does not exist")
        template = template_ref(ref.pool, obs.image_set["dir"])
        if obs.template_size is None:
            acts.append(f"import template {template.spec}")
            base = os.path.getsize(os.path.join(obs.image_set["dir"], "rootfs.raw"))
        else:
            base = obs.template_size
        size = p.get("size_mib")
        if size is not None and size * MiB < base:
            raise ClaimRefused(f"size_mib: {size} is below the image's size {base // MiB}")
        acts.append(f"clone {template.spec} {ref.spec}")
        acts.append(f"set image-meta {META_OWNER} {owner}")
        if size is not None and size * MiB > base:
            acts.append(f"resize {ref.spec} {size}")
    if obs.pv is None:
        acts.append(f"create PersistentVolume {pv_name}")
    if obs.pvc is None:
        acts.append(f"create PersistentVolumeClaim {ns}/{claim}")
    elif _claim_mark(obs.pvc) and not obs.claim_holder:  # the controller's mark of a CloudVM that was deleted
        acts.append(f"release the claim mark of deleted CloudVM uid {_claim_mark(obs.pvc)} on "
                    f"PersistentVolumeClaim {ns}/{claim}")
    return acts


def validate(p: dict) -> None:
    """Check the names before anything is read.

    Raises:
        ClaimRefused: ``namespace`` or ``owner`` is not a DNS label, ``name`` not a DNS subdomain, ``rbd_image`` /
            ``volume_name`` not 1-128 of ``a-z 0-9 . -`` (each named with its value).
    """
    errors = []
    for key in ("namespace", "owner"):
        problem = dns_label_problem(key, p.get(key))
        if problem:
            errors.append(problem)
    subdomain = _SUBDOMAIN_RE
    if not subdomain.match(str(p.get("name") or "")):
        errors.append(f"name: {p.get('name')!r} is not a DNS subdomain (metadata.name of a PersistentVolumeClaim)")
    for key in ("rbd_image", "volume_name"):
        value = str(p.get(key) or "")
        if not subdomain.match(value) or len(value) > IMAGE_NAME_MAX:
            errors.append(f"{key}: {value!r} is not 1-{IMAGE_NAME_MAX} of a-z 0-9 . - (a PersistentVolume name and "
                          "an RBD image name the controller accepts)")
    if p.get("size_mib") is not None and not 1 <= int(p["size_mib"]) <= 67108864:
        errors.append(f"size_mib: {p['size_mib']} is not in 1 to 67108864")
    if errors:
        raise ClaimRefused("; ".join(errors))


# --------------------------------------------------------------------------- effects


def observe(p: dict, rbd: Rbd, api: CoreApi) -> Observed:
    """Read the image (info, image-meta), its pool, the template when the image is missing, the PV and the claim.

    Raises:
        ClaimRefused: an rbd or API call failed. VolumeError: the image set cannot be resolved (named).
    """
    ref = ImageRef(p["pool"], p["rbd_image"])
    try:
        info = rbd.info(ref)
        image = None if info is None else {"size": int(info["size"]), "meta": rbd.meta(ref)}
        obs = Observed(image, pool_exists=True if image is not None else rbd.pool_exists(ref.pool))
        if image is None and p.get("image"):
            obs.image_set = resolve_image(p["images_dir"], p["image"])
            if obs.pool_exists:
                tmpl = template_ref(ref.pool, obs.image_set["dir"])
                tinfo = rbd.info(tmpl.at(None))
                snaps = rbd.snapshots(tmpl.at(None)) if tinfo is not None else []
                if any(s.get("name") == TEMPLATE_SNAPSHOT and str(s.get("protected")) == "true" for s in snaps):
                    obs.template_size = int((tinfo or {})["size"])
    except RbdError as exc:
        raise ClaimRefused(f"cannot read RBD image {ref.spec}: {exc}") from exc
    obs.pv = api.get_pv(p["volume_name"])
    obs.pvc = api.get_pvc(p["namespace"], p["name"])
    if _claim_mark(obs.pvc):
        obs.claim_holder = api.cloudvm_named_by_uid(p["namespace"], _claim_mark(obs.pvc))
    return obs


def _summary(obs: Observed) -> dict:
    return {"rbd_image": None if obs.image is None else {"owner": (obs.image.get("meta") or {}).get(META_OWNER),
                                                         "size_mib": obs.image["size"] // MiB},
            "persistent_volume": obs.pv is not None,
            "persistent_volume_claim": None if obs.pvc is None else (obs.pvc.get("status") or {}).get("phase"),
            "claimed_by": _claim_mark(obs.pvc) or None}


def _make_image(p: dict, rbd: Rbd, obs: Observed) -> int:
    """Import the template if needed, clone it, mark the owner, grow it; returns the image's size in bytes.

    A failure after the clone removes the clone again. Raises ClaimRefused (the rbd call named).
    """
    ref = ImageRef(p["pool"], p["rbd_image"])
    image_set = obs.image_set or {}
    try:
        template, _imported = ensure_template(rbd, ref.pool, image_set["dir"])
        base = int((rbd.info(template.at(None)) or {}).get("size", 0))
    except (VolumeError, RbdError) as exc:
        raise ClaimRefused(f"image: cannot prepare the template of {image_set.get('dir')}: {exc}") from exc
    try:
        rbd.clone(template, ref)
    except RbdError as exc:
        raise ClaimRefused(f"cannot clone {template.spec} to {ref.spec}: {exc}") from exc
    try:
        rbd.meta_set(ref, META_OWNER, p["owner"])
        size = p.get("size_mib")
        if size is not None and size * MiB > base:
            rbd.resize(ref, size)
            return int(size) * MiB
        return base
    except BaseException as exc:
        _remove_image(rbd, ref)
        if isinstance(exc, RbdError):
            raise ClaimRefused(f"cannot mark or grow {ref.spec}: {exc}") from exc
        raise


def _remove_image(rbd: Rbd, ref: ImageRef) -> None:
    try:
        rbd.remove(ref)
    except RbdError:
        pass


def ensure(p: dict, rbd: Rbd, api: CoreApi, check_mode: bool, sleep: Callable[[float], None] = time.sleep,
           monotonic: Callable[[], float] = time.monotonic) -> dict:
    """Observe, plan, and (unless ``check_mode``) create the missing objects, then wait until the claim is Bound.

    In check mode the PV and the claim are sent as server-side dry runs when the image exists (so the API server
    validates them); nothing is created.

    Returns:
        ``{changed, actions, rbd_image: {pool, name, size_mib, owner}, persistent_volume, claim: {namespace, name,
        phase}, diff: {before, after}}``.

    Raises:
        ClaimRefused: every refusal of :func:`validate` / :func:`plan`, failed calls, or the claim not Bound within
            ``wait_timeout`` (the objects stay: the next run finds them).
    """
    validate(p)
    obs = observe(p, rbd, api)
    actions = plan(p, obs)
    before = _summary(obs)
    ns, claim, owner, pv_name = p["namespace"], p["name"], p["owner"], p["volume_name"]
    ref = ImageRef(p["pool"], p["rbd_image"])
    size = obs.image["size"] if obs.image is not None else None
    pvc = obs.pvc
    if actions and not check_mode:
        made_image = made_pv = False
        try:
            if obs.image is None:
                size = _make_image(p, rbd, obs)
                made_image = True
            if obs.pv is None:
                api.create_pv(pv_body(pv_name, ns, claim, ref, int(size or 0), owner), dry_run=False)
                made_pv = True
            if obs.pvc is None:
                pvc = api.create_pvc(pvc_body(ns, claim, pv_name, int(size or 0), owner), dry_run=False)
            elif _claim_mark(obs.pvc) and not obs.claim_holder:
                pvc = api.release_claim_mark(obs.pvc, dry_run=False)
        except BaseException:
            if made_pv:
                try:
                    api.delete_pv(pv_name)
                except ClaimRefused:
                    pass
            if made_image:
                _remove_image(rbd, ref)
            raise
    elif actions and obs.image is not None:  # check mode: let the API server judge what would be created
        if obs.pv is None:
            api.create_pv(pv_body(pv_name, ns, claim, ref, obs.image["size"], owner), dry_run=True)
        if obs.pvc is None:
            api.create_pvc(pvc_body(ns, claim, pv_name, obs.image["size"], owner), dry_run=True)
        elif _claim_mark(obs.pvc) and not obs.claim_holder:
            api.release_claim_mark(obs.pvc, dry_run=True)
    phase = ((pvc or {}).get("status") or {}).get("phase")
    if not check_mode and p.get("wait", True) and phase != "Bound":
        deadline = monotonic() + float(p.get("wait_timeout") or 0)
        while True:
            pvc = api.get_pvc(ns, claim)
            phase = ((pvc or {}).get("status") or {}).get("phase")
            if phase == "Bound":
                break
            if monotonic() >= deadline:
                raise ClaimRefused(f"PersistentVolumeClaim {ns}/{claim}: not Bound to PersistentVolume {pv_name} "
                                   f"after {p.get('wait_timeout')} s (status.phase {phase or '(none)'}); is "
                                   "kube-controller-manager running?")
            sleep(POLL_INTERVAL)
    after = dict(before)
    if actions:
        after = {"rbd_image": {"owner": owner, "size_mib": int(size or 0) // MiB} if size is not None else
                 {"owner": owner, "size_mib": None},
                 "persistent_volume": True, "persistent_volume_claim": phase or "Pending",
                 "claimed_by": _claim_mark(obs.pvc) if obs.claim_holder else None}
    elif phase:
        after["persistent_volume_claim"] = phase
    return {
        "changed": bool(actions),
        "actions": actions,
        "rbd_image": {"pool": ref.pool, "name": ref.image, "size_mib": None if size is None else int(size) // MiB,
                      "owner": owner},
        "persistent_volume": pv_name,
        "claim": {"namespace": ns, "name": claim, "phase": phase, "used_by": obs.claim_holder},
        "diff": {"before": before, "after": after},
    }


def run_root_volume_claim(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.root_volume_claim`` module: :func:`ensure` of the claim ``name`` (or ``vm``'s default root
    volume claim, :func:`model.spec.vm_option_claim`) with ``rbd_image`` defaulting to
    :func:`derived_name` of namespace and name, ``volume_name`` to ``rbd_image``, on the cluster of the
    connection options and the API server of the kubernetes.core auth options.

    Raises:
        ClaimRefused: ``vm`` is not a DNS label, or as :func:`ensure`; CloudVMError: the API client cannot be
            built; CloudError: the Python library ``kubernetes`` is not installed on the managed node.
    """
    p = dict(params)
    if p.get("vm") is not None:
        p["name"], problem = vm_option_claim(p["vm"])
        if problem:
            raise ClaimRefused(problem)
    p["rbd_image"] = p.get("rbd_image") or derived_name(str(p["namespace"]), str(p["name"]))
    p["volume_name"] = p.get("volume_name") or p["rbd_image"]
    try:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.cloudvm import api_client
        from kubernetes.client import CoreV1Api

        api = CoreApi(CoreV1Api(api_client(p)))
        return ensure(p, Rbd(Connection.from_params(p)), api, check_mode)
    except ImportError as exc:
        raise CloudError(f"the Python library 'kubernetes' is not installed on the managed node: {exc}") from exc
