"""Watch-fed caches of the objects a reconcile reads: CloudVMs, Pods, root volume claims (PVCs), Nodes and the
owners' CloudQuotas.

The kopf watch events already carry the objects; :class:`Store` keeps the newest version seen of each, so a
reconcile reads memory instead of the API server. Rules:

* **monotonic**: an object is replaced only by a version with a greater ``metadata.resourceVersion`` (compared as
  integers, which is what the API server's etcd revisions are; a version that is not an integer always replaces).
  The controller's own writes are put in too (:meth:`Store.apply` with the write's response), so a reconcile never
  sees an object older than this process's last write of it, whatever order the watch delivers events in.
* **deletes**: a ``DELETED`` event removes the object and leaves a tombstone with its resourceVersion, so an older
  event arriving late cannot bring it back.
* **relist**: :meth:`Store.replace` installs a full LIST of one kind (at start-up, before any reconcile, and at each
  resync): objects missing from the list and not newer than it are dropped - as an informer's relist.
* **slim Pods**: Pods that are not launcher Pods (no :data:`.pod.LABEL_VM` label) are kept only as what the
  claim index needs (name, labels, resourceVersion, the claims their volumes mount, phase).
* **claim index**: ``(namespace, claim) -> names of the Pods whose volumes mount it``, kept from the Pod events, so
  the check "is the root volume claim used by another Pod" is a dictionary lookup instead of a namespace-wide
  LIST of Pods before every create (N² for N VMs in one namespace).
* **owner index**: ``spec.owner -> (namespace, name) of its CloudVMs``, so a boot's quota check counts the owner's
  VMs without walking every cached CloudVM.

Thread-safe (one lock); objects are plain API dicts (camelCase) and are returned as the stored object - callers
must not modify them.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Optional

from .pod import LABEL_VM, ROOT_CLAIM

Key = tuple[str, str]  # (namespace or "" for cluster-scoped, name)
KINDS = ("cloudvm", "pod", "claim", "node", "quota")  # quota: CloudQuota (cluster-scoped, named after the owner)


def _rv(obj: dict) -> Optional[int]:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except (TypeError, ValueError):
        return None


def _key(obj: dict) -> Key:
    md = obj.get("metadata") or {}
    return md.get("namespace") or "", md.get("name") or ""


def pod_claims(pod: dict) -> frozenset[str]:
    """Names of the PersistentVolumeClaims a Pod uses: those its volumes mount, and the one its
    ``cloud.zjusct.io/root-claim`` annotation names (a launcher of an RBD root disk, which mounts no claim)."""
    mounted = {(v.get("persistentVolumeClaim") or {}).get("claimName")
               for v in (pod.get("spec") or {}).get("volumes") or []}
    mounted.add(((pod.get("metadata") or {}).get("annotations") or {}).get(ROOT_CLAIM))
    return frozenset(c for c in mounted if c)


def slim_pod(pod: dict) -> dict:
    """What the claim index keeps of a Pod that is not a launcher Pod (same dict shape, fewer fields)."""
    md, st = pod.get("metadata") or {}, pod.get("status") or {}
    return {"metadata": {k: md[k] for k in ("name", "namespace", "labels", "resourceVersion", "deletionTimestamp")
                         if k in md},
            "spec": {"volumes": [{"name": f"c{i}", "persistentVolumeClaim": {"claimName": c}}
                                 for i, c in enumerate(sorted(pod_claims(pod)))],
                     "nodeName": (pod.get("spec") or {}).get("nodeName")},
            "status": {"phase": st.get("phase")}}


class _Kind:
    """The newest seen version of every object of one kind, with tombstones of deleted ones."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.tombstones: dict[Key, int] = {}
        self.primed = False

    def newer(self, key: Key, obj: dict) -> bool:
        rv = _rv(obj)
        if rv is None:
            return True
        old = self.objects.get(key)
        old_rv = _rv(old) if old is not None else self.tombstones.get(key)
        return old_rv is None or rv > old_rv


class Store:
    """The caches of :data:`KINDS`, the claim index and the owner index (module docstring for the rules)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds = {k: _Kind() for k in KINDS}
        self._claim_users: dict[Key, set[str]] = defaultdict(set)  # (ns, claim) -> Pod names
        self._launchers: dict[Key, set[str]] = defaultdict(set)  # (ns, vm) -> launcher Pod names
        self._owners: dict[str, set[Key]] = defaultdict(set)  # spec.owner -> (ns, name) of its CloudVMs

    # ------------------------------------------------------------------ writes

    def _index(self, key: Key, old: Optional[dict], new: Optional[dict]) -> None:
        ns, name = key
        for pod, add in ((old, False), (new, True)):
            if pod is None:
                continue
            vm = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_VM)
            groups = [self._claim_users[(ns, c)] for c in pod_claims(pod)]
            if vm:
                groups.append(self._launchers[(ns, vm)])
            for group in groups:
                (group.add if add else group.discard)(name)

    def _put(self, kind: str, obj: dict) -> bool:
        k = self._kinds[kind]
        key = _key(obj)
        if not k.newer(key, obj):
            return False
        if kind == "pod" and not ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_VM):
            obj = slim_pod(obj)
        old = k.objects.get(key)
        k.objects[key] = obj
        k.tombstones.pop(key, None)
        if kind == "pod":
            self._index(key, old, obj)
        elif kind == "cloudvm":
            self._owner_index(key, old, obj)
        return True

    def _owner_index(self, key: Key, old: Optional[dict], new: Optional[dict]) -> None:
        for vm, add in ((old, False), (new, True)):
            owner = ((vm or {}).get("spec") or {}).get("owner")
            if owner:
                group = self._owners[owner]
                (group.add if add else group.discard)(key)
                if not group:
                    del self._owners[owner]

    def _drop(self, kind: str, key: Key, rv: Optional[int]) -> None:
        k = self._kinds[kind]
        old = k.objects.pop(key, None)
        if rv is not None:
            k.tombstones[key] = rv
        if kind == "pod" and old is not None:
            self._index(key, old, None)
        elif kind == "cloudvm" and old is not None:
            self._owner_index(key, old, None)

    def apply(self, kind: str, event_type: Optional[str], obj: dict) -> bool:
        """Apply one watch event (``ADDED``/``MODIFIED``/None for a listing, ``DELETED``) or one write's response
        (``event_type`` None) of ``kind`` (:data:`KINDS`). Returns True when the cache changed."""
        with self._lock:
            if event_type == "DELETED":
                key, rv = _key(obj), _rv(obj)
                cur = self._kinds[kind].objects.get(key)
                cur_rv = _rv(cur) if cur is not None else None
                if rv is not None and cur_rv is not None and cur_rv > rv:
                    return False  # a newer object of that name (re-created) is cached already
                self._drop(kind, key, rv)
                return True
            return self._put(kind, obj)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """Drop one object (an API read answered 404)."""
        with self._lock:
            self._drop(kind, (namespace, name), None)

    def replace(self, kind: str, items: Iterable[dict], list_rv: Optional[str],
                namespaces: Optional[Iterable[str]] = None) -> None:
        """Install a full LIST of ``kind`` (the items and the list's resourceVersion): every item is applied, and
        cached objects missing from it and not newer than the list are dropped. ``namespaces``: the list covered
        only these namespaces (None: all)."""
        try:
            at: Optional[int] = int(list_rv) if list_rv is not None else None
        except ValueError:
            at = None
        scope = None if namespaces is None else frozenset(namespaces)
        with self._lock:
            k = self._kinds[kind]
            seen = set()
            for obj in items:
                seen.add(_key(obj))
                self._put(kind, obj)
            for key in [key for key in k.objects if key not in seen and (scope is None or key[0] in scope)]:
                rv = _rv(k.objects[key])
                if at is None or rv is None or rv <= at:
                    self._drop(kind, key, None)
            k.primed = True

    # ------------------------------------------------------------------ reads

    def primed(self, kind: str) -> bool:
        """True once a full LIST of ``kind`` was installed (:meth:`replace`)."""
        return self._kinds[kind].primed

    def get(self, kind: str, namespace: str, name: str) -> Optional[dict]:
        """The cached object (``namespace`` "" for Nodes), or None."""
        with self._lock:
            return self._kinds[kind].objects.get((namespace, name))

    def launcher_pods(self, namespace: str, vm: str) -> list[dict]:
        """Every cached Pod labelled ``cloud.zjusct.io/vm=<vm>`` in ``namespace``, by name."""
        with self._lock:
            pods = self._kinds["pod"].objects
            return [pods[(namespace, n)] for n in sorted(self._launchers.get((namespace, vm), ()))
                    if (namespace, n) in pods]

    def claim_users(self, namespace: str, claim: str, except_vm: Optional[str] = None) -> list[str]:
        """Names of the cached Pods in ``namespace`` whose volumes mount ``claim`` and that have not ended
        (phase not Succeeded/Failed), leaving out the launcher Pods of ``except_vm``."""
        with self._lock:
            pods = self._kinds["pod"].objects
            out = []
            for n in sorted(self._claim_users.get((namespace, claim), ())):
                pod = pods.get((namespace, n))
                if pod is None or ((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
                    continue
                if except_vm and ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_VM) == except_vm:
                    continue
                out.append(n)
            return out

    def keys(self, kind: str) -> list[Key]:
        """``(namespace, name)`` of every cached object of ``kind``."""
        with self._lock:
            return sorted(self._kinds[kind].objects)

    def owned_by(self, owner: str) -> list[dict]:
        """Every cached CloudVM whose ``spec.owner`` is ``owner``, by (namespace, name)."""
        with self._lock:
            vms = self._kinds["cloudvm"].objects
            return [vms[k] for k in sorted(self._owners.get(owner, ())) if k in vms]

    def launchers_on_node(self, node: str) -> list[Key]:
        """``(namespace, VM name)`` of the cached launcher Pods bound to ``node``."""
        with self._lock:
            return sorted({(ns, (p["metadata"].get("labels") or {})[LABEL_VM])
                           for (ns, _name), p in self._kinds["pod"].objects.items()
                           if (p.get("spec") or {}).get("nodeName") == node
                           and (p["metadata"].get("labels") or {}).get(LABEL_VM)})

    def sizes(self) -> dict[str, int]:
        """Objects cached per kind (for logs and tests)."""
        with self._lock:
            return {k: len(v.objects) for k, v in self._kinds.items()}


def plain(obj: Any) -> dict:
    """A watch event's object as a plain dict (kopf bodies are mappings over the raw dict)."""
    return obj if isinstance(obj, dict) else dict(obj)
