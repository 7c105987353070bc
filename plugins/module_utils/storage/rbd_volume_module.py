# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.rbd_volume``: a pure plan (what to change, or why to refuse) from the observed image and
the requested state, and a runner that observes through ``storage.rbd`` and executes the plan.

Ownership (docs/rbd.md "Ownership marks"): image-meta ``cloud.zjusct.io/owner`` and ``cloud.zjusct.io/claimed-by``. A
request naming an owner or claim that differs from the marks is refused; deleting a claimed image is refused
until the claim is released; releasing a claim, deleting or shrinking is refused while the image has watchers
(a writer may remain — case V2 of docs/architecture.md "Failure cases").

The plan sees every fact the real run depends on, so check mode and the real run reach the same decision and a
refusal comes before any change: watchers, the clones of each snapshot (``rbd children --all``, including clones
in the trash) — a snapshot with clones can be neither unprotected nor removed (rbd: EBUSY) — manual locks
(``rbd lock add``; librbd answers every change with EROFS and ``rbd rm`` hangs, measured on Ceph 16), whether
the pool exists, and the files an export writes into or an import reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import (
    META_CLAIMED_BY,
    META_OWNER,
    Connection,
    ImageRef,
    MiB,
    Rbd,
    RbdError,
    check_name,
    parse_image_spec,
)

META_IMPORTED_FROM = f"{GROUP}/imported-from"
MAX_SIZE_MIB = 64 * 1024 * 1024  # 64 TiB


class VolumeRefused(CloudError):
    """The request is refused; the message names the field, the value and what to do."""


@dataclass
class Observed:
    """What exists now. ``size`` in bytes; ``snapshots``: name -> protected; ``watchers``: list of
    {address, client}; ``meta``: image-meta; ``parent``: ``pool/image@snap`` of a clone, else None;
    ``locks``: ``rbd lock ls`` entries {id, locker, address}; ``children``: snapshot name -> its clones as
    ``rbd children --all`` lists them ({pool, pool_namespace, image, id, trash}; only snapshots that have clones,
    and only when the request could touch snapshots); ``pool_exists``: False when the pool is missing."""

    exists: bool
    size: int = 0
    snapshots: Dict[str, bool] = field(default_factory=dict)
    watchers: List[Dict[str, Any]] = field(default_factory=list)
    meta: Dict[str, str] = field(default_factory=dict)
    parent: Optional[str] = None
    locks: List[Dict[str, Any]] = field(default_factory=list)
    children: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    pool_exists: bool = True


Action = Tuple[Any, ...]


def watcher_names(watchers: List[Dict[str, Any]]) -> str:
    return ", ".join(f"{w.get('address')} (client.{w.get('client')})" for w in watchers)


def child_spec(child: Dict[str, Any]) -> str:
    """``pool[/namespace]/image`` of one ``rbd children`` entry, plus where it is when in the trash."""
    ns = child.get("pool_namespace") or ""
    spec = f"{child.get('pool')}/{ns + '/' if ns else ''}{child.get('image')}"
    if child.get("trash"):
        spec += f" (in the trash, id {child.get('id')})"
    return spec


def _clone_advice(children: List[Dict[str, Any]]) -> str:
    live = [child_spec(c) for c in children if not c.get("trash")]
    gone = [c for c in children if c.get("trash")]
    steps = []
    if live:
        steps.append("flatten each clone (" + "; ".join(f"rbd flatten {s}" for s in live) +
                     ") or delete it")
    if gone:
        steps.append("purge the trashed clones (" + "; ".join(
            f"rbd trash rm {c.get('pool')}/{c.get('id')}" for c in gone) + ") or restore and flatten them")
    return " and ".join(steps) + ", then retry"


def _refuse_clones(what: str, name: str, obs: Observed, snaps: List[str]) -> None:
    """Refuse when any of ``snaps`` has clones: rbd cannot unprotect or remove such a snapshot (EBUSY)."""
    blocked = [(s, obs.children[s]) for s in sorted(snaps) if obs.children.get(s)]
    if not blocked:
        return
    held = "; ".join(f"snapshot {name}@{s} has clones {', '.join(child_spec(c) for c in kids)}"
                     for s, kids in blocked)
    raise VolumeRefused(f"{what} refused: {held}; {_clone_advice([c for _s, kids in blocked for c in kids])}")


def manual_locks(locks: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Locks taken with ``rbd lock add`` (any id not starting with ``auto ``). librbd's own exclusive lock (id
    ``auto <cookie>``) belongs to a watching client, or is broken automatically once its owner is gone; a manual
    lock is never broken: every change fails with EROFS and ``rbd rm`` hangs (measured, Ceph 16)."""
    return [lk for lk in locks if not str(lk.get("id", "")).startswith("auto ")]


def _refuse_locks(name: str, obs: Observed) -> None:
    held = manual_locks(obs.locks)
    if not held:
        return
    desc = ", ".join(f"{lk.get('id')!r} held by {lk.get('locker')} ({lk.get('address')})" for lk in held)
    fix = "; ".join(f"rbd lock rm {name} '{lk.get('id')}' {lk.get('locker')}" for lk in held)
    raise VolumeRefused(f"{name} is locked ({desc}): rbd refuses changes to a locked image (Read-only file "
                        f"system) and deleting it hangs; once the holder is gone remove the lock ({fix}), then retry")


def _validate(p: Dict[str, Any]) -> None:
    check_name("pool", p["pool"])
    check_name("name", p["name"])
    if p.get("snapshot"):
        check_name("snapshot", p["snapshot"])
    if p.get("from_snapshot"):
        check_name("from_snapshot", p["from_snapshot"])
    size = p.get("size_mib")
    if size is not None and not 1 <= size <= MAX_SIZE_MIB:
        raise VolumeRefused(f"size_mib: {size} is outside the range 1-{MAX_SIZE_MIB}")
    if p.get("clone_from"):
        ref = parse_image_spec("clone_from", p["clone_from"], p["pool"])
        if not ref.snapshot:
            raise VolumeRefused(f"clone_from: {p['clone_from']!r} must name a snapshot (pool/image@snapshot)")
    for key in ("owner", "claimed_by"):
        val = p.get(key)
        if val is not None and (not val or len(val) > 253 or any(c.isspace() for c in val)):
            raise VolumeRefused(f"{key}: {val!r} must be 1-253 characters without whitespace")


def _check_marks(p: Dict[str, Any], obs: Observed) -> List[Action]:
    """Ownership checks shared by every state; returns mark-setting actions for state present."""
    actions: List[Action] = []
    owner, claim = obs.meta.get(META_OWNER), obs.meta.get(META_CLAIMED_BY)
    if p.get("owner") and owner and owner != p["owner"]:
        raise VolumeRefused(f"owner: {p['owner']!r} does not match the owner mark {owner!r} of "
                            f"{p['pool']}/{p['name']}")
    if p.get("release_claim"):
        if claim and p.get("claimed_by") and claim != p["claimed_by"]:
            raise VolumeRefused(f"claimed_by: {p['claimed_by']!r} cannot release the claim of {claim!r}")
        if claim and not p.get("claimed_by"):
            raise VolumeRefused(f"release_claim: name the current claimant in claimed_by ({claim!r}) to release it")
        if claim:
            if obs.watchers:
                raise VolumeRefused(f"release_claim: {p['pool']}/{p['name']} still has watchers "
                                    f"{watcher_names(obs.watchers)}; stop the VM or fence the client first")
            actions.append(("meta_remove", META_CLAIMED_BY))
    elif p.get("claimed_by") and claim and claim != p["claimed_by"]:
        raise VolumeRefused(f"claimed_by: {p['claimed_by']!r} but {p['pool']}/{p['name']} is claimed by {claim!r}; "
                            "release that claim first")
    if p["state"] == "present":
        if p.get("owner") and not owner:
            actions.append(("meta_set", META_OWNER, p["owner"]))
        if p.get("claimed_by") and not claim and not p.get("release_claim"):
            actions.append(("meta_set", META_CLAIMED_BY, p["claimed_by"]))
    return actions


def _resize(p: Dict[str, Any], obs: Observed) -> List[Action]:
    want = p.get("size_mib")
    if want is None:
        return []
    want_b = want * MiB
    if want_b == obs.size:
        return []
    if want_b < obs.size:
        if not p.get("allow_shrink"):
            raise VolumeRefused(f"size_mib: {want} is below the current size {obs.size / MiB:g} MiB; shrinking "
                                "destroys data: set allow_shrink=true to do it")
        if obs.watchers:
            raise VolumeRefused(f"size_mib: refusing to shrink {p['pool']}/{p['name']} while it has watchers "
                                f"{watcher_names(obs.watchers)}")
        return [("resize", want, True)]
    return [("resize", want, False)]


def _snapshot(p: Dict[str, Any], obs: Observed) -> List[Action]:
    snap = p.get("snapshot")
    if not snap or p["state"] != "present":
        return []
    want = p.get("snapshot_state") or "present"
    exists = snap in obs.snapshots
    protected = obs.snapshots.get(snap, False)
    name = f"{p['pool']}/{p['name']}"
    if want == "absent":
        if not exists:
            return []
        _refuse_clones("snapshot_state: absent", name, obs, [snap])
        return ([("snap_unprotect", snap)] if protected else []) + [("snap_remove", snap)]
    acts: List[Action] = [] if exists else [("snap_create", snap)]
    if want == "protected" and not protected:
        acts.append(("snap_protect", snap))
    if want == "unprotected" and protected:
        _refuse_clones("snapshot_state: unprotected", name, obs, [snap])
        acts.append(("snap_unprotect", snap))
    return acts


def plan_volume(p: Dict[str, Any], obs: Observed, parent_obs: Optional[Observed] = None) -> List[Action]:
    """Plan the actions reaching the requested state from the observed one. Pure.

    Args:
        p: module parameters (see the module's DOCUMENTATION).
        obs: the image as observed.
        parent_obs: for ``clone_from``, the parent image as observed (its snapshot must exist and be protected).
    Returns:
        actions in execution order (empty = nothing to change).
    Raises:
        VolumeRefused: the request conflicts with the marks, watchers, clones of its snapshots, manual locks,
            snapshots or size rules, or names a missing pool or file (message names the field or the blocking
            objects and what to do). The same observation gives the same decision in check mode and for real.
    """
    acts = _plan(p, obs, parent_obs)
    if obs.exists and any(a[0] != "export" for a in acts):
        _refuse_locks(f"{p['pool']}/{p['name']}", obs)
    return acts


def _need_files(p: Dict[str, Any]) -> None:
    """An import reads ``path`` and ``diffs``: refuse before creating anything when one is not a file."""
    for key, path in [("path", p["path"]), *((f"diffs[{i}]", d) for i, d in enumerate(p.get("diffs") or []))]:
        if not os.path.isfile(path):
            raise VolumeRefused(f"{key}: {path!r} is not an existing file to import")


def _plan(p: Dict[str, Any], obs: Observed, parent_obs: Optional[Observed]) -> List[Action]:
    _validate(p)
    state = p["state"]
    name = f"{p['pool']}/{p['name']}"
    acts: List[Action]
    if state == "absent":
        if not obs.exists:
            return []
        acts = _check_marks(p, obs)
        claim = obs.meta.get(META_CLAIMED_BY)
        if claim and not p.get("release_claim"):
            raise VolumeRefused(f"state: absent refused: {name} is claimed by {claim!r}; release the claim "
                                "(release_claim=true with claimed_by) after the VM is deleted")
        if obs.watchers:
            raise VolumeRefused(f"state: absent refused: {name} has watchers {watcher_names(obs.watchers)}; "
                                "stop the VM, or fence the stale client (blocklist) first")
        _refuse_clones("state: absent", name, obs, list(obs.snapshots))
        _refuse_locks(name, obs)
        if obs.snapshots and not p.get("purge_snapshots"):
            raise VolumeRefused(f"state: absent refused: {name} has snapshots {', '.join(sorted(obs.snapshots))}; "
                                "set purge_snapshots=true to delete them too")
        for snap, prot in sorted(obs.snapshots.items()):
            if prot:
                acts.append(("snap_unprotect", snap))
        if obs.snapshots:
            acts.append(("snap_purge",))
        return [a for a in acts if a[0] != "meta_remove"] + [("remove",)]
    if state == "resized":
        if not obs.exists:
            raise VolumeRefused(f"state: resized needs an existing image; {name} does not exist")
        if p.get("size_mib") is None:
            raise VolumeRefused("size_mib: required with state=resized")
        return _check_marks(p, obs) + _resize(p, obs)
    if state == "exported":
        if not obs.exists:
            raise VolumeRefused(f"state: exported: {name} does not exist")
        _check_marks(p, obs)
        if not p.get("path"):
            raise VolumeRefused("path: required with state=exported")
        snap = str(p.get("snapshot") or "")
        if not snap or snap not in obs.snapshots:
            raise VolumeRefused(f"snapshot: {snap!r} must name an existing snapshot of {name} to export "
                                f"(have: {', '.join(sorted(obs.snapshots)) or 'none'})")
        frm = p.get("from_snapshot")
        if frm and frm not in obs.snapshots:
            raise VolumeRefused(f"from_snapshot: {frm!r} is not a snapshot of {name}")
        fmt = p.get("export_format") or ("diff" if frm else "raw")
        if frm and fmt != "diff":
            raise VolumeRefused("export_format: raw cannot be combined with from_snapshot; use diff")
        if os.path.exists(p["path"]) and not p.get("force"):
            return []
        folder = os.path.dirname(os.path.abspath(p["path"]))
        if not os.path.isdir(folder):
            raise VolumeRefused(f"path: {p['path']!r}: its directory {folder} does not exist")
        return [("export", fmt, snap, frm, p["path"])]
    if state == "imported":
        if not p.get("path"):
            raise VolumeRefused("path: required with state=imported")
        if obs.exists:
            if obs.meta.get(META_IMPORTED_FROM) == import_fingerprint(p):
                return []
            raise VolumeRefused(f"state: imported: {name} already exists; import only into a new image")
        _need_pool(p, obs)
        _need_files(p)
        return [("import", p["path"], list(p.get("diffs") or []))] + [
            a for a in _check_marks(p, Observed(False)) if a[0] == "meta_set"]
    # present
    if not obs.exists:
        _need_pool(p, obs)
        if p.get("clone_from"):
            ref = parse_image_spec("clone_from", p["clone_from"], p["pool"])
            if parent_obs is None or not parent_obs.exists or ref.snapshot not in parent_obs.snapshots:
                raise VolumeRefused(f"clone_from: {ref.spec} does not exist")
            if not parent_obs.snapshots[ref.snapshot]:
                raise VolumeRefused(f"clone_from: snapshot {ref.spec} is not protected; protect the template "
                                    "snapshot first (snapshot_state=protected)")
            acts = [("clone", ref.spec)]
            if p.get("size_mib") and p["size_mib"] * MiB > parent_obs.size:
                acts.append(("resize", p["size_mib"], False))
        elif p.get("size_mib") is None:
            raise VolumeRefused(f"size_mib: required to create {name} (or give clone_from)")
        else:
            acts = [("create", p["size_mib"])]
        new = Observed(True, size=p["size_mib"] * MiB if p.get("size_mib") else 0)
        return acts + _check_marks(p, new) + _snapshot(p, new)
    if p.get("clone_from"):
        want = parse_image_spec("clone_from", p["clone_from"], p["pool"]).spec
        if obs.parent and obs.parent != want:
            raise VolumeRefused(f"clone_from: {name} exists as a clone of {obs.parent}, not {want}")
    acts = _check_marks(p, obs) + _resize(p, obs) + _snapshot(p, obs)
    return acts


def _need_pool(p: Dict[str, Any], obs: Observed) -> None:
    if not obs.pool_exists:
        raise VolumeRefused(f"pool: {p['pool']!r} does not exist; create it first (ceph osd pool create "
                            f"{p['pool']}; rbd pool init {p['pool']})")


def import_fingerprint(p: Dict[str, Any]) -> str:
    """Identifies an import source set (file names and sizes) so a repeated import is recognised."""
    parts = []
    for path in [p["path"], *(p.get("diffs") or [])]:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        parts.append(f"{os.path.basename(path)}:{size}")
    return ",".join(parts)[:1000]


# -- effects -----------------------------------------------------------------------------------------------------

def observe(rbd: Rbd, ref: ImageRef, with_children: bool = False) -> Observed:
    """Read the image's size, snapshots, watchers, meta, parent and locks (one rbd call each) and, with
    ``with_children``, the clones of its snapshots (one ``rbd children --all`` of the image; one per snapshot
    only when that finds clones). For a missing image, whether its pool exists."""
    info = rbd.info(ref)
    if info is None:
        return Observed(False, pool_exists=rbd.pool_exists(ref.pool))
    snaps = {s["name"]: str(s.get("protected")) == "true" for s in rbd.snapshots(ref)}
    parent = info.get("parent")
    pspec = f"{parent['pool']}/{parent['image']}@{parent['snapshot']}" if parent else None
    children: Dict[str, List[Dict[str, Any]]] = {}
    if with_children and snaps and rbd.children(ref, include_trash=True):
        for snap in snaps:
            kids = rbd.children(ref.at(snap), include_trash=True)
            if kids:
                children[snap] = kids
    return Observed(True, size=int(info["size"]), snapshots=snaps, watchers=rbd.status(ref), meta=rbd.meta(ref),
                    parent=pspec, locks=rbd.locks(ref), children=children)


def describe(rbd: Rbd, ref: ImageRef) -> Optional[Dict[str, Any]]:
    """The ``image`` return value: size, features, watchers, locks, snapshots, marks (None if absent)."""
    info = rbd.info(ref)
    if info is None:
        return None
    meta = rbd.meta(ref)
    parent = info.get("parent")
    return {
        "pool": ref.pool, "name": ref.image, "id": info.get("id"), "size_bytes": int(info["size"]),
        "size_mib": int(info["size"]) // MiB, "object_size": info.get("object_size"),
        "features": info.get("features", []),
        "parent": f"{parent['pool']}/{parent['image']}@{parent['snapshot']}" if parent else None,
        "watchers": [{"address": w.get("address"), "client": w.get("client")} for w in rbd.status(ref)],
        "locks": rbd.locks(ref),
        "snapshots": [{"name": s["name"], "size_bytes": s.get("size"), "protected": str(s.get("protected")) == "true",
                       "timestamp": s.get("timestamp")} for s in rbd.snapshots(ref)],
        "owner": meta.get(META_OWNER), "claimed_by": meta.get(META_CLAIMED_BY),
        "marks": {k: v for k, v in meta.items() if k.startswith(f"{GROUP}/")},
    }


def _summary(obs: Observed) -> Dict[str, Any]:
    return {"exists": obs.exists, "size_mib": obs.size // MiB if obs.exists else None,
            "snapshots": {k: ("protected" if v else "present") for k, v in sorted(obs.snapshots.items())},
            "owner": obs.meta.get(META_OWNER), "claimed_by": obs.meta.get(META_CLAIMED_BY)}


def _predict(before: Dict[str, Any], actions: List[Action]) -> Dict[str, Any]:
    after = {k: (dict(v) if isinstance(v, dict) else v) for k, v in before.items()}
    for a in actions:
        kind = a[0]
        if kind in ("create",):
            after.update(exists=True, size_mib=a[1])
        elif kind == "clone":
            after.update(exists=True)
        elif kind == "resize":
            after["size_mib"] = a[1]
        elif kind == "remove":
            after = {"exists": False, "size_mib": None, "snapshots": {}, "owner": None, "claimed_by": None}
        elif kind == "snap_create":
            after["snapshots"][a[1]] = "present"
        elif kind == "snap_protect":
            after["snapshots"][a[1]] = "protected"
        elif kind == "snap_unprotect":
            after["snapshots"][a[1]] = "present"
        elif kind in ("snap_remove",):
            after["snapshots"].pop(a[1], None)
        elif kind == "snap_purge":
            after["snapshots"] = {}
        elif kind == "meta_set":
            after["owner" if a[1] == META_OWNER else "claimed_by"] = a[2]
        elif kind == "meta_remove":
            after["owner" if a[1] == META_OWNER else "claimed_by"] = None
        elif kind == "import":
            after.update(exists=True)
    return after


def _export(rbd: Rbd, ref: ImageRef, fmt: str, snap: str, frm: Optional[str], path: str) -> None:
    tmp = path + ".partial"
    try:
        if fmt == "raw":
            rbd.export(ref.at(snap), tmp, timeout=rbd.conn.timeout)
        else:
            rbd.export_diff(ref.at(snap), tmp, from_snapshot=frm, whole_object=True, timeout=rbd.conn.timeout)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _import(rbd: Rbd, ref: ImageRef, path: str, diffs: List[str], fingerprint: str) -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import HEADER_V1

    with open(path, "rb") as f:
        is_diff = f.read(len(HEADER_V1)) == HEADER_V1
    created = False
    try:
        if is_diff:
            rbd.create(ref, size_bytes=1)
            created = True
            rbd.import_diff(path, ref, timeout=rbd.conn.timeout)
        else:
            rbd.import_raw(path, ref, timeout=rbd.conn.timeout)
            created = True
        for d in diffs:
            rbd.import_diff(d, ref, timeout=rbd.conn.timeout)
        rbd.meta_set(ref, META_IMPORTED_FROM, fingerprint)
    except BaseException:
        if created:
            try:
                rbd.snap_purge(ref)
                rbd.remove(ref)
            except RbdError:
                pass
        raise


def execute(rbd: Rbd, ref: ImageRef, actions: List[Action], p: Dict[str, Any]) -> None:
    """Run planned actions in order (stops at the first RbdError, which propagates)."""
    for a in actions:
        kind = a[0]
        if kind == "create":
            rbd.create(ref, a[1])
        elif kind == "clone":
            rbd.clone(parse_image_spec("clone_from", a[1], ref.pool), ref)
        elif kind == "resize":
            rbd.resize(ref, a[1], allow_shrink=a[2])
        elif kind == "remove":
            rbd.remove(ref)
        elif kind == "snap_create":
            rbd.snap_create(ref.at(a[1]))
        elif kind == "snap_remove":
            rbd.snap_remove(ref.at(a[1]))
        elif kind == "snap_protect":
            rbd.snap_protect(ref.at(a[1]))
        elif kind == "snap_unprotect":
            rbd.snap_unprotect(ref.at(a[1]))
        elif kind == "snap_purge":
            rbd.snap_purge(ref)
        elif kind == "meta_set":
            rbd.meta_set(ref, a[1], a[2])
        elif kind == "meta_remove":
            rbd.meta_remove(ref, a[1])
        elif kind == "export":
            _export(rbd, ref, a[1], a[2], a[3], a[4])
        elif kind == "import":
            _import(rbd, ref, a[1], a[2], import_fingerprint(p))
        else:  # pragma: no cover - plan and execute are written together
            raise ValueError(f"unknown action {kind}")


def run_volume(p: Dict[str, Any], rbd: Rbd, check_mode: bool = False) -> Dict[str, Any]:
    """Observe, plan, (unless check_mode) execute, and build the module result.

    Returns {changed, actions, image, diff: {before, after}}. Raises VolumeRefused or RbdError.
    """
    ref = ImageRef(p["pool"], p["name"])
    # the clones of its snapshots matter whenever the request may unprotect or remove a snapshot
    touches_snaps = p["state"] == "absent" or (
        p["state"] == "present" and bool(p.get("snapshot")) and p.get("snapshot_state") in ("absent", "unprotected"))
    obs = observe(rbd, ref, with_children=touches_snaps)
    parent_obs = None
    if p.get("clone_from") and not obs.exists and p["state"] == "present":
        pref = parse_image_spec("clone_from", p["clone_from"], p["pool"])
        parent_obs = observe(rbd, pref.at(None))
    actions = plan_volume(p, obs, parent_obs)
    before = _summary(obs)
    after = _predict(before, actions)
    if actions and not check_mode:
        execute(rbd, ref, actions, p)
    image = describe(rbd, ref)
    return {
        "changed": bool(actions),
        "actions": [" ".join(str(x) for x in a) for a in actions],
        "image": image,
        "diff": {"before": before, "after": after},
    }


def run_rbd_volume(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The ``zjusct.cloud.rbd_volume`` module: :func:`run_volume` on the cluster of the connection options.

    Raises:
        VolumeRefused, RbdError, or CloudError for a bad connection option (the ValueError's message).
    """
    try:
        return run_volume(params, Rbd(Connection.from_params(params)), check_mode)
    except CloudError:
        raise
    except ValueError as exc:
        raise CloudError(str(exc)) from exc
