# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes adapter of the CloudVM API port (:mod:`cloudvm.port`): CloudVM custom resources through
kube-apiserver, for the one lifecycle of the cloudvm modules (:mod:`cloudvm.lifecycle`).

The API server is the judge of every rule (the CRD's OpenAPI schema and CEL rules in
config/crd/cloudvms.cloud.zjusct.io.yaml, the owner policy config/policy/owner-admission.yaml), so the module reports
the server's own refusal with its field path instead of a second opinion; the controller reconciles in the
background. Every write is a PUT carrying the resourceVersion of the object the plan was computed from (a 409 is
:class:`cloudvm.port.Conflict`).

Connection options, their ``K8S_AUTH_*`` environment fallbacks and client caching come from kubernetes.core
(through :mod:`k8s.client`); CRUD uses the typed ``CustomObjectsApi`` on that client, so no API discovery is needed.
Objects are plain dicts as the API returns them (``managedFields`` removed).

The status is the controller's record alone; a status that says Running is checked against the launcher Pod it
names (``CoreV1Api``, :func:`model.launcher_pod.doubt`) before a wait takes it, and ``cloudvm_info`` reports the
same check (:func:`running_doubts`). Without the right to read Pods (403), or when the API cannot be reached for the
Pod, the status is trusted as before: the check then adds nothing, never a doubt it could not see.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any, Callable, Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.lifecycle import Lifecycle
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.port import Access, Conflict, RootVolume
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import REQUEST_TIMEOUT, ApiException, api_refusal
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import api_client as _api_client
from ansible_collections.zjusct.cloud.plugins.module_utils.model import launcher_pod
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    CloudVMError,
    authorize,
    stated_off,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    GROUP,
    PLURAL,
    VERSION,
    default_root_volume_claim,
)

FIELD_MANAGER = "zjusct.cloud.cloudvm"
POLL_INTERVAL = 1.0  # seconds between GETs while waiting
API_MISSING_HINT = ("the CloudVM API is not installed on this cluster (no CRD cloudvms.cloud.zjusct.io): "
                    "ansible-playbook site.yml -e zjusct_cloud_backend=kubernetes -e cluster_kubeconfig=<kubeconfig> "
                    "installs it (docs/kubernetes.md)")
AUTHORIZE_LABEL = f"{GROUP}/authorized-for"  # the label of the dry-run access question (KubernetesCloudVMApi)


def api_error(exc: ApiException, action: str) -> CloudVMError:
    """Turn an ApiException into a CloudVMError ``<action>: <the server's message>`` with the details of
    :func:`k8s.client.api_refusal` (``api_status``, ``api_reason``, ``field_errors``, ``api_missing``); a 404 that
    says the CloudVM API itself is not served says how to install it (:data:`API_MISSING_HINT`).
    """
    message, details = api_refusal(exc, API_MISSING_HINT)
    return CloudVMError(f"{action}: {message}", **details)


def _clean(obj: Any) -> dict:
    """A CloudVM dict without server bookkeeping that only adds noise (managedFields)."""
    out = copy.deepcopy(obj) if isinstance(obj, dict) else {}
    out.get("metadata", {}).pop("managedFields", None)
    return out


class KubernetesCloudVMApi:
    """:class:`cloudvm.port.CloudVMApi` over ``kubernetes.client.CustomObjectsApi`` (timeouts on every call), and
    ``CoreV1Api`` (``core``, None: no Pod is read, no doubt raised) for the launcher Pods of Running statuses.

    The controller reconciles in the background, so a wait reads the object every :data:`POLL_INTERVAL` seconds;
    the root volume (the claim) is made by ``root_volume_claim``, so ``image`` is ignored (``volume_size_mib`` is
    ``spec.rootVolumeSizeMiB``: the launcher grows the RBD image at the next boot).
    """

    backend = "kubernetes"
    reconciles_in_background = True
    ignored_options = {"image": "host backend only"}
    ssh_gateway = False

    def __init__(self, custom_objects: Any, sleep: Callable[[float], None] = time.sleep, core: Any = None) -> None:
        self._api = custom_objects
        self._sleep = sleep
        self._core = core

    def _call(self, action: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = REQUEST_TIMEOUT
        try:
            return fn(GROUP, VERSION, *args, **kwargs)
        except ApiException as exc:
            if exc.status == 409 and action in ("create", "replace"):
                raise Conflict(str(exc.reason)) from exc
            raise api_error(exc, f"{action} CloudVM") from exc
        except CloudVMError:
            raise
        except Exception as exc:  # urllib3 connection errors, TLS errors, timeouts
            raise CloudVMError(f"{action} CloudVM: cannot reach the Kubernetes API: {exc}") from exc

    def get(self, namespace: str, name: str) -> Optional[dict]:
        try:
            return _clean(self._call("get", self._api.get_namespaced_custom_object, namespace, PLURAL, name))
        except CloudVMError as exc:
            if exc.details.get("api_status") == 404 and not exc.details.get("api_missing"):
                return None  # no such object (a missing CRD is an error, not an absent VM)
            raise

    def launched_boot(self, vm: dict) -> Optional[int]:
        """``status.bootID`` when the status names that boot's launcher Pod (``status.pod``: the controller writes
        it in the pass that creates the Pod, whose LauncherConfig holds the guest's keys), else None."""
        status = vm.get("status") or {}
        return int(status["bootID"]) if status.get("pod") and status.get("bootID") is not None else None

    def create(self, body: dict, dry_run: bool, root_volume: RootVolume) -> dict:
        ns = body["metadata"]["namespace"]
        return _clean(self._call("create", self._api.create_namespaced_custom_object, ns, PLURAL, body,
                                 dry_run="All" if dry_run else None, field_manager=FIELD_MANAGER,
                                 field_validation="Strict"))

    def replace(self, body: dict, dry_run: bool) -> dict:
        md = body["metadata"]
        return _clean(self._call("replace", self._api.replace_namespaced_custom_object, md["namespace"], PLURAL,
                                 md["name"], body, dry_run="All" if dry_run else None,
                                 field_manager=FIELD_MANAGER, field_validation="Strict"))

    def delete_kept_volume(self, namespace: str, name: str, owner: str, operator: bool, dry_run: bool) -> Optional[str]:
        """Refused: this backend always keeps a root volume (RBD image, PersistentVolume, claim; docs/rbd.md).

        Raises:
            CloudVMError: always, naming the claim.
        """
        raise CloudVMError(f"delete_volume: true is not supported on the kubernetes backend; the root volume CloudVM "
                           f"{namespace}/{name} kept (claim {default_root_volume_claim(name)}, its PersistentVolume "
                           "and RBD image) stays; delete it by hand (docs/rbd.md)")

    def delete(self, namespace: str, name: str, dry_run: bool, delete_volume: bool) -> None:
        """Delete with foreground propagation: the CloudVM disappears only after its dependents (the launcher Pod)
        are gone and the controller released its finalizer; the root volume claim is kept.

        Raises:
            CloudVMError: ``delete_volume`` (the root volume - RBD image, PersistentVolume, claim - is always kept
                on this backend, docs/rbd.md), or the API refused.
        """
        if delete_volume:
            raise CloudVMError(f"delete_volume: true is not supported on the kubernetes backend; the root volume of "
                               f"CloudVM {namespace}/{name} (its RBD image, PersistentVolume and claim) is kept; "
                               "delete it by hand (docs/rbd.md)")
        try:
            self._call("delete", self._api.delete_namespaced_custom_object, namespace, PLURAL, name,
                       propagation_policy="Foreground", dry_run="All" if dry_run else None)
        except CloudVMError as exc:
            if exc.details.get("api_status") != 404:
                raise

    def list(self, namespace: Optional[str], name: Optional[str], owner: Optional[str],
             label_selector: str) -> list[dict]:
        """A list with the API server's selectors: ``metadata.name`` and ``spec.owner`` (a selectableField of the
        CRD) as field selectors, the label selector as given; every namespace when ``namespace`` is None."""
        fields = ([f"metadata.name={name}"] if name else []) + ([f"spec.owner={owner}"] if owner else [])
        kwargs = {"label_selector": label_selector or None, "field_selector": ",".join(fields) or None}
        if namespace:
            got = self._call("list", self._api.list_namespaced_custom_object, namespace, PLURAL, **kwargs)
        else:
            got = self._call("list", self._api.list_cluster_custom_object, PLURAL, **kwargs)
        return [_clean(item) for item in got.get("items", [])]

    def _core_read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """``(answered, body)`` of a Pod or Node read through ``CoreV1Api`` (raw JSON, no model classes): ``(True,
        None)`` for 404, ``(False, None)`` when it cannot be read - no ``core``, 403 or another refusal, the API not
        reachable - which the callers take as "nothing to say" (the module docstring)."""
        if self._core is None:
            return False, None
        try:
            got = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            return True, json.loads(got.data)
        except ApiException as exc:
            return (True, None) if exc.status == 404 else (False, None)
        except Exception:  # urllib3 connection errors, TLS errors, timeouts, a body that is not JSON
            return False, None

    def running_doubt(self, vm: dict) -> Optional[str]:
        """:meth:`cloudvm.port.CloudVMApi.running_doubt`: one GET of the launcher Pod ``status.pod`` in the VM's
        namespace, judged by :func:`model.launcher_pod.doubt` (gone, being deleted, or not ``Ready``: the controller
        that writes the status may be down). None without a Pod to check (the status does not say Running for
        ``spec.bootID`` or names no Pod) and when the Pod cannot be read (403: the caller may not read Pods; the API
        not reachable): the status is trusted then, as it was before this check."""
        status = vm.get("status") or {}
        if status.get("bootID") != (vm.get("spec") or {}).get("bootID"):
            return None
        name = launcher_pod.claimed_pod(status)
        if name is None or self._core is None:
            return None
        ns = vm["metadata"]["namespace"]
        answered, pod = self._core_read(self._core.read_namespaced_pod, name, ns)
        if not answered:
            return None
        found = launcher_pod.doubt(ns, status, pod)
        return found.message if found else None

    def boot_node_out_of_service(self, vm: dict) -> bool:
        """:meth:`cloudvm.port.CloudVMApi.boot_node_out_of_service`: one GET of the Node ``status.node``, judged by
        :func:`model.lifecycle.stated_off`; False without a node in the status and when the Node cannot be read
        (gone, 403 for a tenant, the API not reachable)."""
        node = (vm.get("status") or {}).get("node")
        if not node:
            return False
        answered, body = self._core_read(self._core.read_node, node) if self._core is not None else (False, None)
        return bool(answered and stated_off(body))

    def running_doubts(self, vms: Iterable[dict]) -> dict[str, str]:
        """:meth:`running_doubt` of many VMs with one Pod list per namespace (label selector
        :data:`model.launcher_pod.LAUNCHER_SELECTOR`), only in namespaces where a status says Running and names its
        launcher Pod; returns ``{"<namespace>/<name>": doubt}`` of the VMs with a doubt. A namespace whose Pods cannot
        be listed (403, unreachable) adds nothing."""
        vms = list(vms)
        if self._core is None:
            return {}
        claiming = sorted({vm["metadata"]["namespace"] for vm in vms
                           if launcher_pod.claimed_pod(vm.get("status")) is not None})
        listed: set[str] = set()
        pods: dict[tuple[str, str], dict] = {}
        for ns in claiming:
            answered, got = self._core_read(self._core.list_namespaced_pod, ns,
                                            label_selector=launcher_pod.LAUNCHER_SELECTOR)
            if not answered or got is None:
                continue
            listed.add(ns)
            pods.update({(ns, (p.get("metadata") or {}).get("name", "")): p for p in got.get("items") or []})
        found = launcher_pod.doubts([vm for vm in vms if vm["metadata"]["namespace"] in listed], pods)
        return {f"{ns}/{name}": why.message for (ns, name), why in sorted(found.items())}

    def pause(self, namespace: str, name: str, seconds: float) -> None:
        self._sleep(min(POLL_INTERVAL, seconds))

    def ask_access(self, vm: dict, access: Access) -> None:
        """Ask the API server: a server-side dry run (``dryRun=All``: admitted or refused, never stored) of ``vm``
        with the label :data:`AUTHORIZE_LABEL` = the action, made with the module's credentials. A label change is
        an owner-relevant write, so RBAC and the owner admission policy decide as for a real write, and the API
        server's audit log records a refusal with the user, the object and the verdict (docs/security.md, "Audit").

        Raises:
            CloudVMError: ``reason: Forbidden`` on a 403: the owner rule's message when the owners differ (the API
                server's in ``api_message``), else the API server's.
        """
        probe = copy.deepcopy(vm)
        probe.pop("status", None)
        probe["metadata"].setdefault("labels", {})[AUTHORIZE_LABEL] = access.action
        meta = vm["metadata"]
        try:
            self.replace(probe, dry_run=True)
        except Conflict:
            return  # the VM changed since it was listed; the owner rule still decides
        except CloudVMError as exc:
            if exc.details.get("api_status") != 403:
                raise
            auth = {"owner": access.owner, "operator": access.operator}
            try:
                authorize(vm, auth)
            except CloudVMError as refusal:
                raise CloudVMError(str(refusal), **refusal.details, api_message=str(exc)) from exc
            raise CloudVMError(f"owner: {access.owner!r} may not {access.action} CloudVM {meta.get('namespace')}/"
                               f"{meta['name']}: the API server refused it: {exc}", reason="Forbidden",
                               vm_owner=(vm.get("spec") or {}).get("owner"), api_message=str(exc)) from exc

    def record_refusal(self, vm: dict, access: Access, error: CloudError) -> None:
        """Nothing: the API server's audit log holds the refused dry run of :meth:`ask_access`."""


def _client(params: dict) -> KubernetesCloudVMApi:
    """The real adapter, authenticated the way kubernetes.core modules are (options, then K8S_AUTH_*)."""
    client = api_client(params)  # names a missing library first
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    return KubernetesCloudVMApi(CustomObjectsApi(client), core=CoreV1Api(client))


def api_client(params: dict) -> Any:
    """A ``kubernetes.client.ApiClient`` authenticated from the module's kubernetes.core options (then K8S_AUTH_*).

    Raises:
        CloudVMError: the libraries are missing, the kubeconfig does not exist, or the client cannot be set up.
    """
    return _api_client(params, lambda message: CloudVMError(f"backend kubernetes: {message}"))


# --------------------------------------------------------------------------- module entry points


def ensure(params: dict, check_mode: bool, diff: bool) -> dict:
    """Entry point of ``zjusct.cloud.cloudvm`` with ``backend: kubernetes``: the one lifecycle over this adapter.

    Raises:
        CloudVMError: every refusal: the API server's message (with field path) for invalid specs, immutable fields,
            RBAC and the owner policy; wait timeouts naming the last phase and reason.
    """
    return Lifecycle(_client(params)).ensure(params, check_mode, diff)


def info(params: dict) -> list[dict]:
    """Entry point of ``zjusct.cloud.cloudvm_info`` with ``backend: kubernetes``.

    Raises:
        CloudVMError: the API refused (e.g. Forbidden when listing all namespaces without rights).
    """
    return Lifecycle(_client(params)).info(params)


def running_doubts(params: dict, vms: list[dict]) -> dict[str, str]:
    """cloudvm_info's ``running_doubts`` on Kubernetes: ``{"<namespace>/<name>": why}`` for each of ``vms`` (as
    :func:`info` returned them) whose status says Running while its launcher Pod is gone, being deleted or not Ready
    (:meth:`KubernetesCloudVMApi.running_doubts`: one Pod list per namespace with such a VM, none without one). The
    statuses themselves are not changed. Never raises for the Pods: a namespace whose Pods cannot be read adds
    nothing.

    Raises:
        CloudVMError: the API client cannot be set up (as for :func:`info`).
    """
    if not any(launcher_pod.claimed_pod(vm.get("status")) for vm in vms):
        return {}
    return _client(params).running_doubts(vms)


def authorize_found(params: dict, vms: list[dict]) -> None:
    """``cloudvm_info``'s ``authorize`` on Kubernetes (:meth:`cloudvm.lifecycle.Lifecycle.authorize_found`).

    Raises:
        CloudVMError: ``reason: Forbidden``.
    """
    Lifecycle(_client(params)).authorize_found(params, vms)
