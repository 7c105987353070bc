# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CloudVM's root volume on Kubernetes: the claim, the pre-bound RBD PersistentVolume and their names, shared by
``root_volume_claim`` (which makes them, :mod:`k8s.root_volume_claim_module`) and ``root_volume_info`` (which reads
them, :func:`root_volume_info`).

Names (docs/naming.md): the RBD image and the PV (cluster-scoped) are both ``<namespace>.<claim>`` fitted to 128
characters (:func:`derived_name`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import REQUEST_TIMEOUT
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    CLAIMED_BY_MARK,
    GROUP,
    OWNER_MARK,
    PLURAL,
    VERSION,
)

OWNER_LABEL = OWNER_MARK  # on the PV and the claim
CLAIMED_BY = CLAIMED_BY_MARK  # the controller's claim mark on the PVC (uid of the CloudVM using it)
RBD_DRIVER = "rbd.csi.ceph.com"  # the controller's decide.RBD_DRIVER
IMAGE_NAME_MAX = 128  # the controller's rule for volumeAttributes.imageName (1-128 of A-Z a-z 0-9 _ . -)
FIELD_MANAGER = "zjusct.cloud.root_volume_claim"


class ClaimRefused(CloudError):
    """The request conflicts with what exists (another owner, another binding) or is invalid; nothing was changed."""


def derived_name(namespace: str, claim: str) -> str:
    """The RBD image and the PersistentVolume of claim ``namespace/claim``: ``<namespace>.<claim>``
    (:func:`model.names.fit`
    to :data:`IMAGE_NAME_MAX`)."""
    return _names.fit(f"{namespace}.{claim}", IMAGE_NAME_MAX)


def owner_of(obj: dict) -> str:
    """The owner mark (label ``cloud.zjusct.io/owner``) of a PV or claim, ``(none)`` without one."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL) or "(none)")


def claim_mark(pvc: Optional[dict]) -> str:
    """The controller's claim mark on a claim (uid of the CloudVM using it), ``""`` without one."""
    return str((((pvc or {}).get("metadata") or {}).get("annotations") or {}).get(CLAIMED_BY) or "")


class CoreApi:
    """The PersistentVolume / PersistentVolumeClaim calls over ``kubernetes.client.CoreV1Api``; dicts in and out.

    ``get_*`` return None on 404; every other API failure raises :class:`ClaimRefused` with the server's message.
    """

    def __init__(self, core: Any) -> None:
        self.core = core

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import ApiException, api_refusal
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.cloudvm import API_MISSING_HINT

        try:
            got = fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and what.startswith("get"):
                return None
            raise ClaimRefused(f"{what}: {api_refusal(exc, API_MISSING_HINT)[0]}") from exc
        except Exception as exc:  # urllib3 connection errors, TLS errors, timeouts
            raise ClaimRefused(f"{what}: cannot reach the Kubernetes API: {exc}") from exc
        if got is None:
            return None
        out = self.core.api_client.sanitize_for_serialization(got)
        (out.get("metadata") or {}).pop("managedFields", None)
        return out

    def get_pv(self, name: str) -> Optional[dict]:
        return self._call(f"get PersistentVolume {name}", self.core.read_persistent_volume, name)

    def get_pvc(self, ns: str, name: str) -> Optional[dict]:
        return self._call(f"get PersistentVolumeClaim {ns}/{name}", self.core.read_namespaced_persistent_volume_claim,
                          name, ns)

    def create_pv(self, body: dict, dry_run: bool) -> dict:
        return self._call(f"create PersistentVolume {body['metadata']['name']}", self.core.create_persistent_volume,
                          body, dry_run="All" if dry_run else None, field_manager=FIELD_MANAGER)

    def create_pvc(self, body: dict, dry_run: bool) -> dict:
        md = body["metadata"]
        return self._call(f"create PersistentVolumeClaim {md['namespace']}/{md['name']}",
                          self.core.create_namespaced_persistent_volume_claim, md["namespace"], body,
                          dry_run="All" if dry_run else None, field_manager=FIELD_MANAGER)

    def delete_pv(self, name: str) -> None:
        self._call(f"delete PersistentVolume {name}", self.core.delete_persistent_volume, name)

    def release_claim_mark(self, pvc: dict, dry_run: bool) -> dict:
        """Remove the claim's :data:`CLAIMED_BY` annotation, only if the claim is unchanged since it was read (its
        resourceVersion goes with the patch: 409 Conflict otherwise)."""
        md = pvc["metadata"]
        body = {"metadata": {"annotations": {CLAIMED_BY: None}, "resourceVersion": md["resourceVersion"]}}
        return self._call(f"patch PersistentVolumeClaim {md['namespace']}/{md['name']}",
                          self.core.patch_namespaced_persistent_volume_claim, md["name"], md["namespace"], body,
                          dry_run="All" if dry_run else None, field_manager=FIELD_MANAGER)

    def cloudvm_named_by_uid(self, ns: str, uid: str) -> Optional[str]:
        """``ns/name`` of the CloudVM of ``uid`` in ``ns``, or None."""
        try:
            from kubernetes.client import CustomObjectsApi
        except ImportError as exc:  # pragma: no cover - the module checked it
            raise ClaimRefused(f"the Python library 'kubernetes' is missing: {exc}") from exc
        got = self._call(f"list CloudVMs in {ns}", CustomObjectsApi(self.core.api_client).list_namespaced_custom_object,
                         GROUP, VERSION, ns, PLURAL)
        for item in (got or {}).get("items", []):
            if (item.get("metadata") or {}).get("uid") == uid:
                return f"{ns}/{item['metadata']['name']}"
        return None


def describe_claim(api: CoreApi, namespace: str, claim: str) -> tuple[Optional[dict], str]:
    """The root volume claim ``namespace/claim`` in the shape ``zjusct.cloud.root_volume_info`` returns, read-only.

    Returns:
        ``(volume, missing)``: ``volume`` is ``{name, namespace, owner, driver, claimed_by, persistent_volume,
        rbd: {pool, image} or None}`` when the claim is Bound to a PersistentVolume that exists and whose
        ``spec.claimRef`` is this claim (namespace, name and, when both have one, uid) (``driver`` is
        ``rbd`` for a PV of :data:`RBD_DRIVER`, else the PV's ``spec.csi.driver``, ``(none)`` without one), and
        ``missing`` is ``""``; otherwise ``volume`` is None and ``missing`` says which object or field is absent.

    Raises:
        ClaimRefused: an API call failed other than with 404 (the server's message).
    """
    pvc = api.get_pvc(namespace, claim)
    if pvc is None:
        return None, f"no PersistentVolumeClaim {namespace}/{claim}"
    pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
    if not pv_name:
        return None, f"PersistentVolumeClaim {namespace}/{claim} names no PersistentVolume (spec.volumeName)"
    pv = api.get_pv(pv_name)
    if pv is None:
        return None, f"PersistentVolume {pv_name} of PersistentVolumeClaim {namespace}/{claim} does not exist"
    # the PV must be this claim's, as the controller requires of a root disk: a claim anyone may create naming
    # another's PV (spec.volumeName) stays Pending and its PV's claimRef names the other claim
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    uid = (pvc.get("metadata") or {}).get("uid")
    if (ref.get("namespace"), ref.get("name")) != (namespace, claim) or (ref.get("uid") and uid and ref["uid"] != uid):
        return None, (f"PersistentVolume {pv_name}: spec.claimRef is {ref.get('namespace')}/{ref.get('name')}, not "
                      f"PersistentVolumeClaim {namespace}/{claim}")
    phase = (pvc.get("status") or {}).get("phase")
    if phase != "Bound":
        return None, f"PersistentVolumeClaim {namespace}/{claim} is {phase or 'not bound'} (status.phase), not Bound"
    csi = (pv.get("spec") or {}).get("csi") or {}
    attrs = csi.get("volumeAttributes") or {}
    rbd = csi.get("driver") == RBD_DRIVER
    return {
        "name": claim,
        "namespace": namespace,
        "owner": owner_of(pvc),
        "driver": "rbd" if rbd else (csi.get("driver") or "(none)"),
        "claimed_by": claim_mark(pvc) or None,
        "persistent_volume": pv_name,
        "rbd": {"pool": attrs.get("pool") or "", "image": attrs.get("imageName") or ""} if rbd else None,
    }, ""


def root_volume_info(params: dict) -> dict:
    """The Kubernetes half of ``zjusct.cloud.root_volume_info``: :func:`describe_claim` of ``namespace/name``, the
    driver of new root volumes (``rbd``) and the RBD image name a new claim of that name gets (:func:`derived_name`).

    Raises:
        ClaimRefused: an API call failed (named); CloudVMError: the API client cannot be built; CloudError: the
            Python library ``kubernetes`` is not installed on the managed node.
    """
    namespace, claim = str(params.get("namespace") or "default"), str(params["name"])
    try:
        from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.cloudvm import api_client
        from kubernetes.client import CoreV1Api
    except ImportError as exc:
        raise CloudError(f"the Python library 'kubernetes' is not installed on the managed node: {exc}") from exc
    volume, missing = describe_claim(CoreApi(CoreV1Api(api_client(params))), namespace, claim)
    return {"changed": False, "volume": volume, "missing": missing, "volume_driver": "rbd",
            "rbd_image": derived_name(namespace, claim), "host_config": None}
