# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.k8s_node_resources``: extended resources in a Node's ``status.capacity``.

Kubernetes lets anyone with ``nodes/status`` rights advertise an *extended resource* on a Node by patching
``status.capacity`` (https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/); the scheduler
then places Pods by ``sum(requests) <= status.allocatable``. A kubelet copies capacity into allocatable at its next
status update; a Node without a kubelet (and a kubelet between two updates) does not, so this module writes both,
with one JSON Patch of ``nodes/<name>/status`` (``add`` replaces an existing key, ``remove`` for
``state=absent``). Nothing is sent when both already hold the wanted quantity (compared as quantities: the API
server may answer ``1k`` for ``1000``).

Resource names: ``<domain>/<name>``, the domain a DNS subdomain outside ``kubernetes.io`` and ``*.kubernetes.io``
(those are Kubernetes' own), the name 1-63 of ``A-Z a-z 0-9 - _ .`` starting and ending alphanumeric and not
starting with ``requests.`` (Kubernetes' extended resource name rule). Quantities: non-negative integers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import REQUEST_TIMEOUT, ApiException, api_client

FIELDS = ("capacity", "allocatable")
_DOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_SUFFIX = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class NodeResourcesError(CloudError):
    """Bad input (naming the option and the value) or an API refusal."""


def check_resources(resources: dict, state: str) -> dict:
    """Validate ``resources`` (name -> quantity) and return it as name -> int (values ignored for absent).

    Raises:
        NodeResourcesError: a name outside the extended resource rule or a value that is not an integer >= 0,
            naming ``resources.<name>``, the value and what is allowed.
    """
    if not resources:
        raise NodeResourcesError("resources: empty; give at least one extended resource, e.g. "
                                 "{'cloud.zjusct.io/bandwidth-mbps': 1000}")
    out = {}
    for name, value in resources.items():
        domain, slash, short = str(name).partition("/")
        if (not slash or not _DOMAIN.match(domain) or not _NAME.match(short) or short.startswith("requests.")
                or domain == "kubernetes.io" or domain.endswith(".kubernetes.io")):
            raise NodeResourcesError(
                f"resources: {name!r} is not an extended resource name (<domain>/<name>: the domain a DNS "
                "subdomain outside kubernetes.io, the name 1-63 of A-Z a-z 0-9 - _ . starting and ending "
                "alphanumeric, e.g. cloud.zjusct.io/bandwidth-mbps)")
        if state == "absent":
            out[str(name)] = 0
            continue
        number: Any = value
        if isinstance(value, str) and re.fullmatch(r"\d{1,18}", value.strip()):
            number = int(value.strip())
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise NodeResourcesError(f"resources.{name}: {value!r} is not an integer >= 0 (status.capacity."
                                     f"{name} of the Node; for bandwidth: Mbit/s)")
        out[str(name)] = number
    return out


def quantity(text: Any) -> Optional[Decimal]:
    """A Kubernetes quantity (``100``, ``1k``, ``2Gi``, ``500m``) as a Decimal; None when missing or unreadable."""
    if text is None:
        return None
    match = re.fullmatch(r"([+-]?[0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+)?", str(text).strip())
    if not match:
        return None
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        return None
    suffix = match.group(2) or ""
    if suffix == "m":
        return number / 1000
    if suffix in _SUFFIX:
        return number * _SUFFIX[suffix]
    if suffix:
        return number * (Decimal(10) ** int(suffix[1:]))
    return number


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def plan(status: dict, wanted: dict, state: str) -> tuple[list, dict, dict]:
    """The JSON Patch turning the Node's ``status`` into one with ``wanted`` in capacity and allocatable.

    Args:
        status: the Node's ``status`` (``capacity``, ``allocatable``: name -> quantity string).
        wanted: name -> int (:func:`check_resources`).
        state: ``present`` (set each to its value) or ``absent`` (remove each).

    Returns:
        ``(ops, before, after)``: the JSON Patch operations (empty: nothing to do) and, for the diff, name ->
        capacity string of the named resources before and after (None: absent).
    """
    ops: list = []
    before = {n: (status.get("capacity") or {}).get(n) for n in wanted}
    after = dict(before)
    for field in FIELDS:
        have = status.get(field)
        for name, value in wanted.items():
            current = (have or {}).get(name)
            if state == "absent":
                if current is not None:
                    ops.append({"op": "remove", "path": f"/status/{field}/{_pointer(name)}"})
                if field == "capacity":
                    after[name] = None
                continue
            if field == "capacity":
                after[name] = str(value)
            if quantity(current) == Decimal(value):
                continue
            if have is None:  # no such map yet: add it whole (a JSON Patch cannot add below a missing parent)
                ops.append({"op": "add", "path": f"/status/{field}", "value": {name: str(value)}})
                have = {name: str(value)}
                continue
            ops.append({"op": "add", "path": f"/status/{field}/{_pointer(name)}", "value": str(value)})
    return ops, before, after


def _core(params: dict) -> Any:
    client = api_client(params, NodeResourcesError)  # names a missing library first
    from kubernetes.client import CoreV1Api

    return CoreV1Api(client)


def run(params: dict, check_mode: bool, core: Any = None) -> dict:
    """Carry out the module: read the Node, patch its status when something differs (not in check mode).

    Returns:
        The module result: ``changed``, ``node``, ``capacity`` (name -> quantity of the named resources after
        the task; None for absent), ``diff`` ``{before, after}``.

    Raises:
        NodeResourcesError: bad input, no such Node (option ``name``), or the API server refused (status and
            message).
    """
    state = params.get("state") or "present"
    wanted = check_resources(params.get("resources") or {}, state)
    node = params["name"]
    core = core or _core(params)
    try:
        obj = core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            raise NodeResourcesError(f"name: Node {node!r} does not exist") from exc
        raise NodeResourcesError(f"reading Node {node}: {exc.status} {exc.reason}: {exc.body}") from exc
    status = core.api_client.sanitize_for_serialization(obj).get("status") or {}
    ops, before, after = plan(status, wanted, state)
    if ops and not check_mode:
        try:
            core.patch_node_status(node, ops, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            raise NodeResourcesError(f"patching nodes/{node}/status: {exc.status} {exc.reason}: {exc.body}") from exc
    return {"changed": bool(ops), "node": node, "capacity": after, "diff": {"before": before, "after": after}}


def run_k8s_node_resources(params: dict, check_mode: bool, diff: bool) -> dict:
    """The ``zjusct.cloud.k8s_node_resources`` module: :func:`run`; ``diff`` only when asked.

    Raises:
        NodeResourcesError: as :func:`run`; the failure result also names the ``node`` (option ``name``).
    """
    try:
        result = run(params, check_mode)
    except NodeResourcesError as exc:
        exc.details.setdefault("node", params["name"])
        raise
    if not diff:
        result.pop("diff")
    return result
