# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes backend of the cloudvm modules: CloudVM custom resources through kube-apiserver.

The API server is the judge of every rule (the CRD's OpenAPI schema and CEL rules in
config/crd/cloudvms.cloud.zjusct.io.yaml), so the module reports the server's own refusal with its
field path instead of a second opinion. What this module decides itself is pure and shared
(:mod:`model.lifecycle`): the desired spec and the power plan. Every write is a PUT carrying the
resourceVersion of the object the plan was computed from; a 409 Conflict means someone else wrote
in between, and the plan is recomputed from a fresh GET. That is what makes ``power_state: running``
bump ``bootID`` exactly once even when two runs race or a task is retried.

Connection options, their ``K8S_AUTH_*`` environment fallbacks and client caching come from
kubernetes.core (through :mod:`k8s.client`); CRUD uses the typed
``CustomObjectsApi`` on that client, so no API discovery is needed.

Shapes: ``params`` is the module's parameter dict (``cloudvm_module.cloudvm_argument_spec``).
Objects are plain dicts as the API returns them (``managedFields`` removed). Times in seconds.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Optional, Protocol

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import ApiException
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import api_client as _api_client
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    CloudVMError,
    authorize,
    off_but_failed,
    params_to_spec,
    plan_power,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import parse_message
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

FIELD_MANAGER = "zjusct.cloud.cloudvm"
REQUEST_TIMEOUT = 30  # seconds, every API call
CONFLICT_RETRIES = 10  # re-plans after a 409 before giving up
POLL_INTERVAL = 1.0  # seconds between GETs while waiting
OFF_PHASES = ("Stopped", "Failed")  # no launcher remains
# status reasons of a refusal the controller met (docs/controller.md, Refusals): the quota or the API server said no
REFUSAL_REASONS = ("QuotaExceeded", "Refused")
HOST_ONLY_OPTIONS = ("image", "volume_size_mib")
NO_SUCH_RESOURCE = "could not find the requested resource"  # kube-apiserver's 404 for an unknown resource type


# --------------------------------------------------------------------------- the API adapter


class CloudVMApi(Protocol):
    """What the backend needs from kube-apiserver (the real adapter, or a fake in unit tests).

    Every method raises :class:`CloudVMError` for API failures; ``get`` returns None on 404 and
    ``create``/``replace`` raise :class:`Conflict` on 409.
    """

    def get(self, namespace: str, name: str) -> Optional[dict]: ...

    def create(self, body: dict, dry_run: bool) -> dict: ...

    def replace(self, body: dict, dry_run: bool) -> dict: ...

    def delete(self, namespace: str, name: str, dry_run: bool) -> None: ...

    def list(self, namespace: Optional[str], label_selector: str, field_selector: str) -> list[dict]: ...


class Conflict(CloudError):
    """The object changed (or appeared) since it was read: re-plan from a fresh GET."""


def api_error(exc: ApiException, action: str) -> CloudVMError:
    """Turn an ApiException into a CloudVMError carrying the server's message and field causes.

    The server's Status ``message`` already names the field path (for CEL and schema refusals:
    ``spec.owner: Forbidden: is immutable (was alice, requested bob)``); it is kept
    verbatim. Details: ``api_status`` (HTTP code), ``api_reason`` (Status reason such as Invalid,
    Forbidden, NotFound) and ``field_errors`` (list of ``{field, message}``).
    """
    import json

    status = getattr(exc, "status", None)
    message, reason, causes = "", getattr(exc, "reason", "") or "", []
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict):
        message = body.get("message") or ""
        reason = body.get("reason") or reason
        for cause in (body.get("details") or {}).get("causes") or []:
            causes.append({"field": cause.get("field", ""), "message": cause.get("message", "")})
    if not message:
        message = f"HTTP {status} {reason}".strip()
    if status == 404 and NO_SUCH_RESOURCE in message:
        message += " (is the CloudVM CRD installed? kubectl apply -f config/crd/)"
    return CloudVMError(f"{action}: {message}", api_status=status, api_reason=reason, field_errors=causes)


def _clean(obj: Any) -> dict:
    """A CloudVM dict without server bookkeeping that only adds noise (managedFields)."""
    out = copy.deepcopy(obj) if isinstance(obj, dict) else {}
    out.get("metadata", {}).pop("managedFields", None)
    return out


class KubernetesCloudVMApi:
    """:class:`CloudVMApi` over ``kubernetes.client.CustomObjectsApi`` (timeouts on every call)."""

    def __init__(self, custom_objects: Any) -> None:
        self._api = custom_objects

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
            if exc.details.get("api_status") == 404 and NO_SUCH_RESOURCE not in str(exc):
                return None  # no such object (a missing CRD is an error, not an absent VM)
            raise

    def create(self, body: dict, dry_run: bool) -> dict:
        ns = body["metadata"]["namespace"]
        return _clean(self._call("create", self._api.create_namespaced_custom_object, ns, PLURAL, body,
                                 dry_run="All" if dry_run else None, field_manager=FIELD_MANAGER,
                                 field_validation="Strict"))

    def replace(self, body: dict, dry_run: bool) -> dict:
        md = body["metadata"]
        return _clean(self._call("replace", self._api.replace_namespaced_custom_object, md["namespace"], PLURAL,
                                 md["name"], body, dry_run="All" if dry_run else None,
                                 field_manager=FIELD_MANAGER, field_validation="Strict"))

    def delete(self, namespace: str, name: str, dry_run: bool) -> None:
        # Foreground: the CloudVM disappears only after its dependents (the launcher Pod) are gone.
        self._call("delete", self._api.delete_namespaced_custom_object, namespace, PLURAL, name,
                   propagation_policy="Foreground", dry_run="All" if dry_run else None)

    def list(self, namespace: Optional[str], label_selector: str, field_selector: str) -> list[dict]:
        kwargs = {"label_selector": label_selector or None, "field_selector": field_selector or None}
        if namespace:
            got = self._call("list", self._api.list_namespaced_custom_object, namespace, PLURAL, **kwargs)
        else:
            got = self._call("list", self._api.list_cluster_custom_object, PLURAL, **kwargs)
        return [_clean(item) for item in got.get("items", [])]


def _client(params: dict) -> KubernetesCloudVMApi:
    """The real adapter, authenticated the way kubernetes.core modules are (options, then K8S_AUTH_*)."""
    client = api_client(params)  # names a missing library first
    from kubernetes.client import CustomObjectsApi

    return KubernetesCloudVMApi(CustomObjectsApi(client))


def api_client(params: dict) -> Any:
    """A ``kubernetes.client.ApiClient`` authenticated from the module's kubernetes.core options (then K8S_AUTH_*).

    Raises:
        CloudVMError: the libraries are missing, the kubeconfig does not exist, or the client cannot be set up.
    """
    return _api_client(params, lambda message: CloudVMError(f"backend kubernetes: {message}"))


# --------------------------------------------------------------------------- pure helpers


def _str_labels(labels: Optional[dict]) -> dict:
    return {str(k): str(v) for k, v in (labels or {}).items()}


def desired_object(params: dict, existing: Optional[dict], power_state: Optional[str]) -> dict:
    """The CloudVM body to write for the module's options over ``existing`` (None when absent).

    Options left unset keep the existing values; labels are merged; the power plan is
    :func:`model.lifecycle.plan_power` over the existing spec and status. Pure.
    """
    spec = params_to_spec(params, (existing or {}).get("spec"))
    spec = plan_power(spec, (existing or {}).get("status"), power_state)
    if existing is None:
        metadata: dict = {"name": params["name"], "namespace": params["namespace"]}
        if params.get("labels"):
            metadata["labels"] = _str_labels(params["labels"])
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    body = copy.deepcopy(existing)
    body.pop("status", None)  # status is the controller's (status subresource); a PUT ignores it anyway
    labels = dict(body["metadata"].get("labels") or {})
    labels.update(_str_labels(params.get("labels")))
    if labels:
        body["metadata"]["labels"] = labels
    body["spec"] = spec
    return body


def _view(obj: Optional[dict]) -> dict:
    """The part of a CloudVM the module writes: labels and spec."""
    if not obj:
        return {}
    labels = dict((obj.get("metadata") or {}).get("labels") or {})
    return {"labels": labels, "spec": copy.deepcopy(obj.get("spec") or {})}


def needs_write(existing: Optional[dict], desired: dict) -> bool:
    """True when ``desired`` differs from ``existing`` in labels or spec (the only fields the module sets)."""
    return existing is None or _view(existing) != _view(desired)


def target_reached(obj: Optional[dict], target: str) -> bool:
    """True when ``obj`` shows the target phase for its current spec.

    ``target``: ``Running`` (status.bootID == spec.bootID and phase Running: the SSH banner
    answered), ``Stopped`` (phase Stopped or Failed: no launcher remains) or ``absent``
    (``obj`` is None). Running and Stopped also require ``status.observedGeneration`` to have
    caught up with ``metadata.generation``, so a status written before the request never counts.
    """
    if target == "absent":
        return obj is None
    if obj is None:
        return False
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if generation is not None and int(status.get("observedGeneration", -1)) < int(generation):
        return False
    if target == "Running":
        return status.get("phase") == "Running" and status.get("bootID") == obj["spec"].get("bootID")
    return status.get("phase") in OFF_PHASES


def boot_ended(obj: Optional[dict]) -> Optional[str]:
    """A message when the boot a Running wait is for has already ended (Stopped or Failed), else None."""
    if not obj:
        return None
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    # bootID names one boot, so a status for spec.bootID that says Stopped/Failed is final for it.
    if status.get("bootID") == spec.get("bootID") and status.get("phase") in OFF_PHASES:
        return (f"boot {spec.get('bootID')} ended in phase {status.get('phase')} "
                f"(reason {status.get('reason', '-')}): {status.get('message', '')}".rstrip(": "))
    return None


def refusal(obj: Optional[dict], target: str) -> Optional[tuple[str, str]]:
    """``(reason, message)`` when the controller reports that what a wait for ``target`` (``Running`` or
    ``Stopped``) awaits was refused - the owner's CloudQuota, a namespace ResourceQuota or LimitRange, an admission
    policy (status reason in :data:`REFUSAL_REASONS`, for the current ``metadata.generation`` and, for Running,
    ``spec.bootID``) - else None. The controller retries such a VM by itself, so this is final only for the wait."""
    if not obj or target not in ("Running", "Stopped"):
        return None
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if status.get("reason") not in REFUSAL_REASONS:
        return None
    if generation is not None and int(status.get("observedGeneration", -1)) < int(generation):
        return None
    if target == "Running" and status.get("bootID") != spec.get("bootID"):
        return None
    return str(status["reason"]), str(status.get("message") or "")


def timeout_message(namespace: str, name: str, target: str, timeout: float, obj: Optional[dict]) -> str:
    """The wait timeout message: what was awaited and the last phase and reason seen."""
    want = {"Running": "Running (SSH ready)", "Stopped": "Stopped", "absent": "deleted"}[target]
    if target == "Running" and obj:
        want += f" with bootID {obj['spec'].get('bootID')}"
    status = (obj or {}).get("status") or {}
    last = f"phase {status.get('phase') or '(none yet)'}, reason {status.get('reason') or '-'}"
    if status.get("bootID") is not None:
        last += f", status.bootID {status['bootID']}"
    if status.get("message"):
        last += f": {status['message']}"
    finalizers = ((obj or {}).get("metadata") or {}).get("finalizers")
    if target == "absent" and finalizers:
        last += f"; deletion waits for finalizers {', '.join(finalizers)}"
    return f"CloudVM {namespace}/{name}: timed out after {timeout:g} s waiting until {want}; last {last}"


def _refused_error(ns: str, name: str, target: str, refused: tuple[str, str], obj: dict,
                   changed: bool) -> CloudVMError:
    """The wait's failure for :func:`refusal`: the controller's message, ``reason`` (``QuotaExceeded`` or
    ``Refused``) and, for an owner quota, the host backend's fields ``quota``, ``owner``, ``limit``, ``in_use``,
    ``requested`` (:func:`model.quota.parse_message`)."""
    reason, message = refused
    what = {"Running": f"boot {(obj.get('spec') or {}).get('bootID')}", "Stopped": "the stop"}[target]
    still = ("the VM stays asked to run: the controller retries it and starts it once allowed "
             "(power_state: stopped withdraws the request)" if target == "Running"
             else "the controller retries the stop")
    details: dict[str, Any] = {"reason": reason, "changed": changed, "cloudvm": obj,
                               "phase": (obj.get("status") or {}).get("phase")}
    details.update(parse_message(message) or {})
    return CloudVMError(f"CloudVM {ns}/{name}: {what} refused ({reason}): {message}; {still}", **details)


def _result(obj: Optional[dict], changed: bool, before: Optional[dict], diff: bool, warnings: list[str]) -> dict:
    result: dict[str, Any] = {"changed": changed}
    if obj is not None:
        result["cloudvm"] = obj
        result["phase"] = (obj.get("status") or {}).get("phase")
        result["boot_id"] = (obj.get("spec") or {}).get("bootID")
    if diff:  # the spec before and after, as on the host backend
        result["diff"] = {"before": _view(before).get("spec", {}), "after": _view(obj).get("spec", {})}
    if warnings:
        result["warnings"] = warnings
    return result


# --------------------------------------------------------------------------- the state machine


class Backend:
    """ensure/info over a :class:`CloudVMApi`; ``sleep``/``monotonic`` are injectable for tests."""

    def __init__(self, api: CloudVMApi, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.sleep = sleep
        self.monotonic = monotonic

    # ------------------------------------------------------------- writes

    def apply(self, params: dict, power_state: Optional[str], check_mode: bool) -> tuple[Optional[dict], dict, bool]:
        """Create or update the CloudVM; returns ``(before, after, changed)``.

        Re-plans from a fresh GET after every 409 Conflict (at most :data:`CONFLICT_RETRIES`).

        Raises:
            CloudVMError: the server refused (message with field path), or the object kept
                changing under us.
        """
        ns, name = params["namespace"], params["name"]
        for _unused in range(CONFLICT_RETRIES):
            existing = self.api.get(ns, name)
            authorize(existing, params)
            if existing is None and not params.get("owner"):
                raise CloudVMError(f"CloudVM {ns}/{name} does not exist; owner is required to create it")
            desired = desired_object(params, existing, power_state)
            if not needs_write(existing, desired):
                if existing is None:
                    raise AssertionError("existing unexpectedly missing")
                return existing, existing, False
            try:
                if existing is None:
                    after = self.api.create(desired, dry_run=check_mode)
                else:
                    after = self.api.replace(desired, dry_run=check_mode)
            except Conflict:
                continue
            return existing, after, _view(existing) != _view(after)
        raise CloudVMError(f"CloudVM {ns}/{name}: gave up after {CONFLICT_RETRIES} conflicting concurrent writes")

    def wait_for(self, ns: str, name: str, target: str, timeout: float, changed: bool) -> Optional[dict]:
        """Poll until :func:`target_reached`; returns the last object (None once deleted).

        Raises:
            CloudVMError: timeout (message from :func:`timeout_message`), or the awaited boot ended
                (Running only). ``changed`` goes into the error details.
        """
        deadline = self.monotonic() + timeout
        while True:
            obj = self.api.get(ns, name)
            if target_reached(obj, target):
                return obj
            if target == "Running":
                ended = boot_ended(obj)
                if ended:
                    raise CloudVMError(f"CloudVM {ns}/{name}: {ended}", changed=changed, cloudvm=obj,
                                       phase=(obj or {}).get("status", {}).get("phase"))
            refused = refusal(obj, target)
            if refused is not None:
                raise _refused_error(ns, name, target, refused, obj or {}, changed)
            if target != "absent" and obj is None:
                raise CloudVMError(f"CloudVM {ns}/{name} was deleted while waiting", changed=changed)
            remaining = deadline - self.monotonic()
            if remaining <= 0:
                raise CloudVMError(timeout_message(ns, name, target, timeout, obj), changed=changed,
                                   cloudvm=obj or {}, phase=((obj or {}).get("status") or {}).get("phase"))
            self.sleep(min(POLL_INTERVAL, remaining))

    def ensure(self, params: dict, check_mode: bool, diff: bool) -> dict:
        """The cloudvm module's result for ``params`` (see module documentation)."""
        warnings = [f"{opt} is ignored by the kubernetes backend (host backend only)"
                    for opt in HOST_ONLY_OPTIONS if params.get(opt) is not None]
        ns, name = params["namespace"], params["name"]
        wait, timeout = params.get("wait", True), float(params.get("wait_timeout") or 0)
        if params.get("state") == "absent":
            return self.absent(params, check_mode, diff, warnings)
        if params.get("restart"):
            return self.restart(params, check_mode, diff, warnings)
        power = params.get("power_state")
        before, after, changed = self.apply(params, power, check_mode)
        if wait and not check_mode and power is not None:
            target = "Running" if power == "running" else "Stopped"
            after = self.wait_for(ns, name, target, timeout, changed) or after
            off = off_but_failed(ns, name, after.get("status")) if target == "Stopped" else None
            warnings += [off] if off else []
        return _result(after, changed, before, diff, warnings)

    def restart(self, params: dict, check_mode: bool, diff: bool, warnings: list[str]) -> dict:
        """Stop, wait Stopped (always, bounded by wait_timeout), start with bootID + 1, wait Running if asked."""
        ns, name = params["namespace"], params["name"]
        timeout = float(params.get("wait_timeout") or 0)
        before, stopped, _changed = self.apply(params, "stopped", check_mode)
        if check_mode:  # predict the start on top of the predicted stop; nothing is written
            predicted = desired_object(params, {**stopped, "status": {}}, "running")
            predicted["status"] = (before or {}).get("status", {})
            return _result(predicted, True, before, diff, warnings)
        off = off_but_failed(ns, name, (self.wait_for(ns, name, "Stopped", timeout, changed=True) or {}).get("status"))
        warnings += [off] if off else []
        _before, after, _changed = self.apply(params, "running", check_mode=False)
        if params.get("wait", True):
            after = self.wait_for(ns, name, "Running", timeout, changed=True) or after
        return _result(after, True, before, diff, warnings)

    def absent(self, params: dict, check_mode: bool, diff: bool, warnings: list[str]) -> dict:
        """Delete the CloudVM (its root volume claim is kept) and wait until it is gone."""
        ns, name = params["namespace"], params["name"]
        existing = self.api.get(ns, name)
        if existing is None:
            return _result(None, False, None, diff, warnings)
        authorize(existing, params)
        try:
            self.api.delete(ns, name, dry_run=check_mode)
        except CloudVMError as exc:
            if exc.details.get("api_status") != 404:
                raise
        if params.get("wait", True) and not check_mode:
            self.wait_for(ns, name, "absent", float(params.get("wait_timeout") or 0), changed=True)
        return _result(None, True, existing, diff, warnings)

    # ------------------------------------------------------------- reads

    def info(self, params: dict) -> list[dict]:
        """CloudVMs matching name / namespace / owner / label_selectors, ordered by namespace and name."""
        ns, name = params.get("namespace"), params.get("name")
        fields = []
        if name:
            fields.append(f"metadata.name={name}")
        if params.get("owner"):
            fields.append(f"spec.owner={params['owner']}")  # a selectableField of the CRD
        items = self.api.list(ns, ",".join(params.get("label_selectors") or []), ",".join(fields))
        return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


# --------------------------------------------------------------------------- module entry points


def ensure(params: dict, check_mode: bool, diff: bool) -> dict:
    """Entry point of ``zjusct.cloud.cloudvm`` with ``backend: kubernetes``.

    Returns:
        The module result: ``changed``, ``cloudvm`` (the object, absent after deletion), ``phase``,
        ``boot_id``, ``diff`` {before, after} (the spec) when ``diff``, ``warnings``.

    Raises:
        CloudVMError: every refusal: the API server's message (with field path) for invalid specs,
            immutable fields and RBAC; wait timeouts naming the last phase and reason.
    """
    return Backend(_client(params)).ensure(params, check_mode, diff)


AUTHORIZE_LABEL = f"{GROUP}/authorized-for"  # the label of cloudvm_info's dry-run authorization probe


def authorize_found(params: dict, vms: list[dict]) -> None:
    """``cloudvm_info``'s ``authorize`` on Kubernetes: ask the API server whether the module's identity may act on
    each CloudVM found, then compare the owners here too.

    The question is a server-side dry run (``dryRun=All``: admitted or refused, never stored) of the CloudVM with
    the label :data:`AUTHORIZE_LABEL` = the action added: a label change is an owner-relevant write, so RBAC and the
    owner admission policy (config/policy/owner-admission.yaml) decide exactly as for a real write, and the API
    server's audit log records a refusal with the user, the object and the verdict (docs/security.md, "Audit").
    The owner comparison (:func:`model.lifecycle.authorize`) follows for a cluster without the policy.

    Raises:
        CloudVMError: ``reason: Forbidden``: the VM belongs to another owner, or the API server refused the dry run
            (its message in ``api_message``).
    """
    auth = params["authorize"]
    api = _client(params)
    for vm in vms:
        probe = copy.deepcopy(vm)
        probe.pop("status", None)
        probe["metadata"].setdefault("labels", {})[AUTHORIZE_LABEL] = auth["action"]
        meta = vm["metadata"]
        try:
            api.replace(probe, dry_run=True)
        except Conflict:
            pass  # the VM changed since it was listed; the owner comparison below still decides
        except CloudVMError as exc:
            if exc.details.get("api_status") != 403:
                raise
            try:
                authorize(vm, auth)  # another owner's VM: the one refusal message, with the API server's beside it
            except CloudVMError as refusal:
                raise CloudVMError(str(refusal), **refusal.details, api_message=str(exc)) from exc
            raise CloudVMError(f"owner: {auth['owner']!r} may not {auth['action']} CloudVM {meta.get('namespace')}/"
                               f"{meta['name']}: the API server refused it: {exc}", reason="Forbidden",
                               vm_owner=(vm.get("spec") or {}).get("owner"), api_message=str(exc)) from exc
        authorize(vm, auth)


def info(params: dict) -> list[dict]:
    """Entry point of ``zjusct.cloud.cloudvm_info`` with ``backend: kubernetes``.

    Raises:
        CloudVMError: the API refused (e.g. Forbidden when listing all namespaces without rights).
    """
    return Backend(_client(params)).info(params)
