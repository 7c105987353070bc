# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Body of ``zjusct.cloud.owner_quota`` with ``backend: kubernetes``: one owner's CloudQuota.

A CloudQuota (config/crd/cloudquotas.cloud.zjusct.io.yaml) is cluster-scoped and named after the owner; its spec
holds the limits (``vms``, ``vcpus``, ``memoryMiB``, ``diskMiB``, ``bandwidthMbps``; absent: unlimited), the same
dimensions and units as the host store's ``quotas`` row (:mod:`model.quota`). The controller admits every boot of
the owner's CloudVMs within it (docs/security.md, "Quotas on Kubernetes"); this module only writes it and reports
the owner's usage as the controller counts it (:func:`model.quota.counted_usage` over the owner's CloudVMs in every
namespace the caller may list, and their root volume claims).

Writes: a create, or a replace carrying the read ``resourceVersion`` (a concurrent writer makes it re-read, at most
:data:`CONFLICT_RETRIES` times), or a delete for ``state: absent``; nothing is written when the limits are already
those asked for. Check mode sends the same write as a server-side dry run (``dryRun=All``), so the API server's
validation and authorization answer without anything stored.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import (
    REQUEST_TIMEOUT,
    ApiException,
    api_client,
    api_refusal,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION, dns_label_problem

CONFLICT_RETRIES = 5


class QuotaError(CloudError):
    """A request of owner_quota on Kubernetes that cannot be carried out (the option or the API's answer named)."""


API_MISSING_HINT = ("the CloudQuota API is not installed on this cluster (no CRD cloudquotas.cloud.zjusct.io): "
                    "site.yml's cluster role applies config/crd/cloudquotas.cloud.zjusct.io.yaml")


def _api_error(exc: Any, what: str) -> QuotaError:
    """``<what>: <the server's message>`` (:func:`k8s.client.api_refusal`) with ``api_status`` and ``api_missing``."""
    message, details = api_refusal(exc, API_MISSING_HINT)
    return QuotaError(f"{what}: {message}", api_status=details["api_status"], api_missing=details["api_missing"])


class Conflict(CloudError):
    """The CloudQuota changed between the read and the write."""


class KubernetesQuotaApi:
    """CloudQuotas, and the owner's CloudVMs and claims, through ``CustomObjectsApi`` and ``CoreV1Api``."""

    def __init__(self, custom: Any, core: Any) -> None:
        self.custom, self.core = custom, core

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(what) from exc
            raise _api_error(exc, what) from exc
        except Exception as exc:  # urllib3 connection errors, TLS errors, timeouts
            raise QuotaError(f"{what}: cannot reach the Kubernetes API: {exc}") from exc

    def get(self, owner: str) -> Optional[dict]:
        try:
            return dict(self._call(f"get CloudQuota {owner}", self.custom.get_cluster_custom_object, GROUP,
                                   VERSION, quota.CRD_PLURAL, owner))
        except QuotaError as exc:
            if exc.details.get("api_status") == 404 and not exc.details.get("api_missing"):
                return None
            raise

    def write(self, body: dict, existing: Optional[dict], dry_run: bool) -> dict:
        name = body["metadata"]["name"]
        dry = "All" if dry_run else None
        if existing is None:
            return dict(self._call(f"create CloudQuota {name}", self.custom.create_cluster_custom_object, GROUP,
                                   VERSION, quota.CRD_PLURAL, body, dry_run=dry, field_manager="zjusct.cloud"))
        return dict(self._call(f"replace CloudQuota {name}", self.custom.replace_cluster_custom_object, GROUP,
                               VERSION, quota.CRD_PLURAL, name, body, dry_run=dry, field_manager="zjusct.cloud"))

    def delete(self, owner: str, dry_run: bool) -> None:
        self._call(f"delete CloudQuota {owner}", self.custom.delete_cluster_custom_object, GROUP, VERSION,
                   quota.CRD_PLURAL, owner, dry_run="All" if dry_run else None)

    def owner_vms(self, owner: str) -> list:
        got = self._call(f"list the CloudVMs of owner {owner}", self.custom.list_cluster_custom_object, GROUP,
                         VERSION, PLURAL, field_selector=f"spec.owner={owner}")
        return list(got.get("items") or [])

    def claim(self, namespace: str, name: str) -> Optional[dict]:
        try:
            got = self._call(f"get PersistentVolumeClaim {namespace}/{name}",
                             self.core.read_namespaced_persistent_volume_claim, name, namespace,
                             _preload_content=False)
        except QuotaError as exc:
            if exc.details.get("api_status") == 404:
                return None
            raise
        return dict(json.loads(got.data))


def usage(api: Any, owner: str) -> dict:
    """What ``owner`` uses now, counted as the controller counts it (:func:`model.quota.counted_usage`)."""
    items = []
    for vm in api.owner_vms(owner):
        spec, ns = vm.get("spec") or {}, (vm.get("metadata") or {}).get("namespace", "")
        claim = str(spec.get("rootVolumeClaim") or "")
        admitted = quota.admitted_boot(vm.get("status"))
        size = quota.root_volume_mib(api.claim(ns, claim), spec) if claim and admitted is not None else 0
        items.append(quota.Counted(spec, admitted, (ns, claim), size))
    return quota.counted_usage(items)


def validate(params: dict) -> Optional[dict]:
    """The limits ``params`` ask for (None for ``state: absent``).

    Raises:
        QuotaError: the owner is not a DNS label, or a limit is not an integer >= 0 (option and CloudQuota field
            named).
    """
    owner = params.get("owner")
    problem = dns_label_problem("owner", owner, "the CloudVM spec.owner rule; it names the CloudQuota, metadata.name")
    if problem:
        raise QuotaError(problem, field="owner")
    if params.get("state", "present") != "present":
        return None
    wanted = {dim: params.get(dim) for dim in quota.LIMITS}
    errors = [f"{error} (CloudQuota spec.{quota.API_FIELDS[error.split(':')[0]]})"
              for error in quota.validate_limits(wanted)]
    if errors:
        raise QuotaError("; ".join(errors))
    return wanted


def set_quota(params: dict, check_mode: bool, diff: bool, api: Any) -> dict:
    """Make ``params['owner']``'s CloudQuota hold exactly the limits given (``state: present``) or remove it.

    Returns:
        ``{"changed", "owner", "quota" (limits, None per unlimited dimension, or None without a CloudQuota),
        "usage", "warnings"?, "diff"?}`` - the shape of the host backend's result.

    Raises:
        QuotaError: bad input (see :func:`validate`), or the API server refused or cannot be reached (its message).
    """
    owner = params["owner"]
    wanted = validate(params)
    for _attempt in range(CONFLICT_RETRIES):
        existing = api.get(owner)
        before = quota.limits_from_spec(existing.get("spec")) if existing is not None else None
        changed = before != wanted
        try:
            if changed and wanted is None:
                api.delete(owner, dry_run=check_mode)
            elif changed and wanted is not None:
                body: dict = {"apiVersion": f"{GROUP}/{VERSION}", "kind": quota.CRD_KIND,
                              "metadata": {"name": owner}, "spec": quota.spec_from_limits(wanted)}
                if existing is not None:
                    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                    body["metadata"]["labels"] = dict((existing.get("metadata") or {}).get("labels") or {})
                api.write(body, existing, dry_run=check_mode)
        except Conflict:
            continue
        break
    else:
        raise QuotaError(f"CloudQuota {owner}: gave up after {CONFLICT_RETRIES} conflicting concurrent writes")
    used = usage(api, owner)
    out: dict = {"changed": changed, "owner": owner, "quota": wanted, "usage": used}
    over = [f"{dim}: owner {owner!r} already uses {used[dim]} of the quota {wanted[dim]} {quota.UNITS[dim]};"
            " nothing is stopped, growth is refused until the usage is below the quota"
            for dim in quota.LIMITS if wanted and wanted[dim] is not None and used[dim] > wanted[dim]]
    if over:
        out["warnings"] = over
    if diff:
        out["diff"] = {"before": before or {}, "after": wanted or {}}
    return out


def ensure_quota(params: dict, check_mode: bool, diff: bool) -> dict:
    """``zjusct.cloud.owner_quota`` on Kubernetes (its body: ``owner_quota_module.run_owner_quota``): :func:`set_quota`
    through the real API client.

    Returns:
        The module result, as :func:`set_quota`.

    Raises:
        QuotaError: bad input (option named), the API client cannot be built, or the API server refused.
    """
    validate(params)  # bad input is named before any connection is made
    client = api_client(params, lambda message: QuotaError(f"backend kubernetes: {message}"))
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    return set_quota(params, check_mode, diff, KubernetesQuotaApi(CustomObjectsApi(client), CoreV1Api(client)))
