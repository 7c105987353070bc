"""A CloudVM's root volume: may the VM start on its claim (:func:`claim_use`: the claim is Bound, carries no other
owner's mark and no other CloudVM's claim mark; :func:`used_by_pods`: no other Pod uses it), and the RBD image a Block
claim's PersistentVolume names (:func:`rbd_root_disk`). Pure: the claim and the PersistentVolume are read by
:mod:`.reconcile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import CLAIMED_BY_MARK, with_defaults

from .config import CEPH_NAME_RE, Config
from .pod import CEPH_CONF_PATH, KEYRING_PATH, OWNER_LABEL

CLAIMED_BY = CLAIMED_BY_MARK  # PVC annotation: uid of the CloudVM using the root volume
RBD_DRIVER = "rbd.csi.ceph.com"  # the CSI driver name an RBD PV carries (Ceph-CSI's, no driver needed on nodes)


class VolumeProblem(Exception):
    """A root volume claim the controller cannot start a VM on.

    Attributes:
        reason: the status reason (``VolumeClaimNotReady`` or ``VolumeNotSupported``).
        message: names the object (claim or PersistentVolume), the field, its value and what is allowed.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def is_block_claim(claim: Optional[dict]) -> bool:
    """True when the claim asks for a raw block volume (``spec.volumeMode: Block``): an RBD root disk."""
    return ((claim or {}).get("spec") or {}).get("volumeMode") == "Block"


def rbd_root_disk(claim: dict, volume: Optional[dict], cfg: Config) -> dict:
    """The launcher's ``rootDisk.rbd`` for a Bound Block claim, from its PersistentVolume.

    The PV must be bound to this claim (``spec.claimRef``), ``volumeMode: Block`` and name the image the way
    Ceph-CSI does: ``spec.csi.driver`` :data:`RBD_DRIVER`, ``spec.csi.volumeAttributes.pool`` and ``.imageName``
    (1-128 of ``A-Z a-z 0-9 _ . -``, the launcher's rule). No CSI driver runs: the launcher Pod does not mount
    the claim, QEMU opens the image through librbd with :attr:`Config.ceph`.

    Returns:
        ``{"pool", "image", "conf", "user", "keyringPath"}`` (paths inside the launcher Pod).

    Raises:
        VolumeProblem: ``VolumeNotSupported`` (no ``ceph`` in the controller config, the PV is not an RBD PV or
            not Block) or ``VolumeClaimNotReady`` (the PV is missing or bound to another claim), naming the
            object and the field.
    """
    md, spec = claim.get("metadata") or {}, claim.get("spec") or {}
    name, pv_name = md.get("name", ""), spec.get("volumeName") or ""
    if cfg.ceph is None:
        raise VolumeProblem("VolumeNotSupported", f"the root volume claim {name} is a Block volume (spec.volumeMode)"
                            " but the controller config has no ceph section (docs/controller.md)")
    if volume is None:
        raise VolumeProblem("VolumeClaimNotReady", f"PersistentVolume {pv_name or '(none)'} of the root volume "
                            f"claim {name} (spec.volumeName) does not exist")
    vspec = volume.get("spec") or {}
    ref = vspec.get("claimRef") or {}
    if (ref.get("namespace"), ref.get("name")) != (md.get("namespace"), name) or (
            ref.get("uid") and md.get("uid") and ref["uid"] != md["uid"]):
        raise VolumeProblem("VolumeClaimNotReady", f"PersistentVolume {pv_name}: spec.claimRef is "
                            f"{ref.get('namespace')}/{ref.get('name')}, not the root volume claim "
                            f"{md.get('namespace')}/{name}")
    if vspec.get("volumeMode") != "Block":
        raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.volumeMode is "
                            f"{vspec.get('volumeMode') or 'Filesystem'}, an RBD root disk needs Block")
    csi = vspec.get("csi") or {}
    if csi.get("driver") != RBD_DRIVER:
        raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.csi.driver is "
                            f"{csi.get('driver') or '(none)'}, an RBD root disk needs {RBD_DRIVER}")
    attrs = csi.get("volumeAttributes") or {}
    for key in ("pool", "imageName"):
        value = attrs.get(key)
        if not isinstance(value, str) or not CEPH_NAME_RE.match(value):
            raise VolumeProblem("VolumeNotSupported", f"PersistentVolume {pv_name}: spec.csi.volumeAttributes."
                                f"{key} is {value!r}, not an RBD name (1-128 of A-Z a-z 0-9 _ . -)")
    return {"pool": attrs["pool"], "image": attrs["imageName"], "conf": CEPH_CONF_PATH, "user": cfg.ceph.user,
            "keyringPath": KEYRING_PATH}


def owner_problem(owner: str, claim: dict, volume: Optional[dict]) -> Optional[str]:
    """Why the root volume claim (and its PersistentVolume, when read) is not ``owner``'s, or None.

    The owner mark is the label :data:`OWNER_LABEL` (``root_volume_claim`` writes it on the claim and the PV
    after checking the RBD image's own mark). A claim or PV that carries another owner's mark belongs to that
    owner: a CloudVM of ``owner`` that names it would boot another tenant's disk (docs/security.md, threat model).
    An object without the mark is not judged here (an operator's own volume, e.g. pre-bound by hand).

    Returns:
        A message naming the object, the field, both owners and what to do; None when no mark disagrees.
    """
    md = claim.get("metadata") or {}
    marked = [(f"PersistentVolumeClaim {md.get('namespace')}/{md.get('name')}", claim)]
    if volume is not None:
        marked.append((f"PersistentVolume {(volume.get('metadata') or {}).get('name')}", volume))
    for what, obj in marked:
        mark = ((obj.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL)
        if mark is not None and mark != owner:
            return (f"the root volume claim {md.get('name')} belongs to owner {mark} ({what} "
                    f"metadata.labels[{OWNER_LABEL}]), not to {owner} (spec.owner): a CloudVM boots only its "
                    f"owner's volumes; name a claim of {owner} in spec.rootVolumeClaim")
    return None


@dataclass(frozen=True)
class ClaimUse:
    """Whether a VM may start on its root volume claim (:func:`claim_use`, :func:`used_by_pods`).

    Attributes:
        problem: why it may not, naming the claim, its PersistentVolume or the Pods and the field; None: it may.
        reason: the status reason of ``problem`` (``VolumeClaimNotReady``, ``VolumeOwnerMismatch``,
            ``VolumeInUse``, ``VolumeNotSupported``); ``""`` when there is none.
        mark: the claim does not carry the VM's claim mark (:data:`CLAIMED_BY`) yet: write it before the Pod.
        rbd: for a usable Block claim the launcher's ``rootDisk.rbd`` (:func:`rbd_root_disk`), else None.
    """

    problem: Optional[str] = None
    reason: str = ""
    mark: bool = False
    rbd: Optional[dict] = None


def claim_use(vm: dict, claim: Optional[dict], volume: Optional[dict], cfg: Config) -> ClaimUse:
    """Whether the CloudVM ``vm`` may start on the root volume claim ``claim`` (its ``spec.rootVolumeClaim``, None
    when it does not exist), judged on the claim and its PersistentVolume ``volume`` alone; the other Pods that use
    the claim are :func:`used_by_pods`' to judge.

    Problems, in this order: the claim is missing or not Bound (``VolumeClaimNotReady``), the claim or its PV
    carries another owner's mark (``VolumeOwnerMismatch``, :func:`owner_problem`), another CloudVM uid's claim mark
    (``VolumeInUse``), a Block claim whose PV does not name an RBD image this controller can open (the reason of
    :func:`rbd_root_disk`'s :class:`VolumeProblem`).
    """
    spec = with_defaults(vm.get("spec") or {})
    name = spec["rootVolumeClaim"]
    if claim is None:
        return ClaimUse(f"the root volume claim {name} does not exist", "VolumeClaimNotReady")
    foreign = owner_problem(spec["owner"], claim, volume)
    if foreign:
        return ClaimUse(foreign, "VolumeOwnerMismatch")
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Bound":
        return ClaimUse(f"the root volume claim {name} is {phase or 'not bound'} (waiting until it is Bound)",
                        "VolumeClaimNotReady")
    holder = ((claim.get("metadata") or {}).get("annotations") or {}).get(CLAIMED_BY)
    uid = vm["metadata"]["uid"]
    if holder and holder != uid:
        return ClaimUse(f"the root volume claim {name} is claimed by CloudVM uid {holder} ({CLAIMED_BY})",
                        "VolumeInUse")
    rbd = None
    if is_block_claim(claim):
        try:
            rbd = rbd_root_disk(claim, volume, cfg)
        except VolumeProblem as exc:
            return ClaimUse(exc.message, exc.reason)
    return ClaimUse(mark=holder != uid, rbd=rbd)


def used_by_pods(claim_name: str, writers: Sequence[str]) -> ClaimUse:
    """The verdict on a claim that :func:`claim_use` allows, once the Pods that use it are known: ``writers`` are
    the names of Pods not of this VM that mount the claim or name it in their :data:`.pod.ROOT_CLAIM` annotation
    and have not ended. Any: ``VolumeInUse`` naming them (sorted); none: no problem (the caller keeps
    :func:`claim_use`'s verdict)."""
    if not writers:
        return ClaimUse()
    return ClaimUse(f"Pod {', '.join(sorted(writers))} uses the root volume claim {claim_name}", "VolumeInUse")
