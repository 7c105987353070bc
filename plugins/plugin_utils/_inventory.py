# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CloudVM inventory's decisions: which VMs become hosts, under which names, with which
variables and in which groups.

Everything here is a pure function over plain data, shared by both sources of the
``zjusct.cloud.cloudvm`` inventory plugin (Kubernetes CloudVM objects, the host backend's store)
and tested without any server:

* :class:`InventoryOptions` holds the plugin's options after validation (errors name the option,
  the value and what is allowed).
* :func:`vm_record` reduces a CRD-shaped CloudVM dict to the few fields the inventory uses; the
  records are what the plugin caches (a 10,000-VM cache stays a few MiB).
* :func:`launcher_checked` (Kubernetes source) turns a record whose status says Running into phase ``Unknown``
  when its launcher Pod is gone, being deleted or not Ready (:func:`model.launcher_pod.doubt`).
* :func:`select` filters records (namespaces, owners, label selector, phases).
* :func:`host_entries` turns the selected records into :class:`HostEntry` values (name, hostvars,
  groups) and reports name collisions.

Shapes: a CloudVM dict has ``metadata{namespace,name,uid,labels}``, ``spec{owner,vcpus,memoryMiB,
bootID}``, ``status{phase,reason,bootID,node,sshEndpoint{host,port},sshProxyCommand}`` as in
config/crd/cloudvms.cloud.zjusct.io.yaml (sshProxyCommand is written by the host backend only).
Units: memory in MiB, ports are TCP ports.
"""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model import launcher_pod
from ansible_collections.zjusct.cloud.plugins.module_utils.model.selectors import Requirement, SelectorError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.selectors import (
    parse_label_selector as _parse_label_selector,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import PHASES

SOURCES = ("kubernetes", "host")  # the backends of module_utils/backend.py's BACKENDS, as the option lists them
# The inventory's own default, not the modules' (backend.DEFAULT_BACKEND, host): a source file without ``source:``
# has always listed a cluster; docs/architecture.md "The backend choice" says why the two defaults stay apart.
DEFAULT_SOURCE = "kubernetes"
HOSTVARS_LAYOUTS = ("flat", "nested")
GROUP_BY = ("owner", "namespace", "node", "phase")
HOSTNAME_FIELDS = ("namespace", "name", "owner", "uid", "node")
DEFAULT_HOSTNAME = "{name}.{namespace}"
# Without a prefix ``name`` and ``namespace`` would be reserved variable names (Ansible warns) and
# ``node`` or ``labels`` easily collide with a site's own variables.
DEFAULT_PREFIX = "cloudvm_"
_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Label keys: optional DNS-subdomain prefix and a name (Kubernetes "Labels and Selectors").


class InventoryOptionError(ValueError):
    """An option has a value the plugin cannot use; the message names option, value and what is allowed."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class InventoryOptions:
    """The plugin's options after validation (connection options live in :mod:`._kube_list`).

    Attributes:
        source: ``kubernetes`` (CloudVM objects through kube-apiserver) or ``host`` (the host store).
        namespaces: namespaces to list; empty means all (one cluster-wide list).
        label_selector: Kubernetes label selector (equality and set based), "" for none.
        owners: only VMs whose ``spec.owner`` is one of these; empty for all.
        include_phases: phases whose VMs become hosts (default only Running: SSH answers).
        include_all: every VM whatever its phase (overrides ``include_phases``).
        hostname_format: ``str.format`` template over ``namespace``, ``name``, ``owner``, ``uid``,
            ``node``; the default ``{name}.{namespace}`` cannot collide because neither part may
            contain a dot.
        hostvar_prefix: prefix of every host variable this plugin sets except the ``ansible_*`` ones
            (default ``cloudvm_``; "" gives the bare names, of which ``name`` and ``namespace`` are
            reserved by Ansible).
        hostvars_layout: ``flat`` (one variable per field, ``<prefix><field>``) or ``nested`` (one dict
            variable named by the prefix without its trailing ``_``, e.g. ``cloudvm``, holding the same
            fields under their bare names); the ``ansible_*`` connection variables are set in both.
        group_by: built-in groups: ``owner`` → ``owner_<owner>``, ``namespace`` →
            ``namespace_<namespace>``, ``node`` → ``node_<node>``, ``phase`` → ``phase_<phase>``
            (characters other than letters, digits and ``_`` become ``_``).
        ansible_user: SSH user of the guests.
        use_proxy_command: use the ``status.sshProxyCommand`` the backend publishes.
        use_ssh_gateway: use the ``status.sshJumpHost`` (the host backend's SSH gateway) as ``ProxyJump``;
            for clients outside the hypervisor host. Wins over the proxy command.
        jump_host: SSH jump host (``ProxyJump``) for VMs without a proxy command; may use the
            hostname fields, e.g. ``root@{node}``; "" for none.
    """

    source: str = DEFAULT_SOURCE
    namespaces: tuple[str, ...] = ()
    label_selector: str = ""
    owners: tuple[str, ...] = ()
    include_phases: tuple[str, ...] = ("Running",)
    include_all: bool = False
    hostname_format: str = DEFAULT_HOSTNAME
    hostvar_prefix: str = DEFAULT_PREFIX
    hostvars_layout: str = "flat"
    group_by: tuple[str, ...] = ("owner", "namespace", "node")
    ansible_user: str = "root"
    use_proxy_command: bool = True
    use_ssh_gateway: bool = False
    jump_host: str = ""
    selector: tuple["Requirement", ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_options(cls, get: Callable[[str], Any]) -> "InventoryOptions":
        """Build and validate the options from a getter (the plugin's ``get_option``).

        Raises:
            InventoryOptionError: a value is outside what is allowed (message names the option).
        """
        source = get("source") or DEFAULT_SOURCE
        if source not in SOURCES:
            raise InventoryOptionError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
        phases = tuple(get("include_phases") or ())
        for phase in phases:
            if phase not in PHASES:
                raise InventoryOptionError(f"include_phases: {phase!r} is not a phase; allowed: {', '.join(PHASES)}")
        group_by = tuple(get("group_by") or ())
        for key in group_by:
            if key not in GROUP_BY:
                raise InventoryOptionError(f"group_by: {key!r} is not one of {', '.join(GROUP_BY)}")
        fmt = get("hostname_format") or DEFAULT_HOSTNAME
        check_format("hostname_format", fmt)
        jump = get("jump_host") or ""
        if jump:
            check_format("jump_host", jump)
        prefix = get("hostvar_prefix")
        prefix = DEFAULT_PREFIX if prefix is None else prefix
        if prefix and not _VAR_NAME.match(prefix):
            raise InventoryOptionError(
                f"hostvar_prefix: {prefix!r} must start with a letter or _ and contain only letters, digits and _")
        layout = get("hostvars_layout") or "flat"
        if layout not in HOSTVARS_LAYOUTS:
            raise InventoryOptionError(f"hostvars_layout: {layout!r} is not one of {', '.join(HOSTVARS_LAYOUTS)}")
        if layout == "nested" and not prefix.rstrip("_"):
            raise InventoryOptionError(
                f"hostvars_layout: nested names its one variable after hostvar_prefix without the trailing _, "
                f"and hostvar_prefix {prefix!r} leaves no name; set hostvar_prefix, e.g. cloudvm_")
        selector_text = get("label_selector") or ""
        return cls(
            source=source,
            namespaces=tuple(get("namespaces") or ()),
            label_selector=selector_text,
            owners=tuple(get("owners") or ()),
            include_phases=phases,
            include_all=bool(get("include_all")),
            hostname_format=fmt,
            hostvar_prefix=prefix,
            hostvars_layout=layout,
            group_by=group_by,
            ansible_user=get("ansible_user") or "root",
            use_proxy_command=bool(get("use_proxy_command")) if get("use_proxy_command") is not None else True,
            use_ssh_gateway=bool(get("use_ssh_gateway")),
            jump_host=jump,
            selector=parse_label_selector(selector_text),
        )


def check_format(option: str, fmt: str) -> None:
    """Refuse a ``str.format`` template that uses anything but the hostname fields.

    Raises:
        InventoryOptionError: unknown field, positional field, or malformed braces.
    """
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError as exc:
        raise InventoryOptionError(f"{option}: {fmt!r} is not a valid format string: {exc}") from exc
    for _literal, name, _spec, _conv in parsed:
        if name is None:
            continue
        if name not in HOSTNAME_FIELDS:
            allowed = ", ".join("{" + f + "}" for f in HOSTNAME_FIELDS)
            raise InventoryOptionError(f"{option}: {fmt!r} uses {{{name}}}; allowed fields: {allowed}")


# --------------------------------------------------------------------------- label selectors


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """:func:`model.selectors.parse_label_selector`, its error as an :class:`InventoryOptionError`.

    Raises:
        InventoryOptionError: a requirement cannot be parsed (named in the message).
    """
    try:
        return _parse_label_selector(text)
    except SelectorError as exc:
        raise InventoryOptionError(str(exc)) from exc


# --------------------------------------------------------------------------- records


def vm_record(obj: dict) -> dict:
    """Reduce a CRD-shaped CloudVM dict to what the inventory needs (JSON-serialisable, cacheable).

    Returns:
        ``{namespace, name, uid, labels, owner, vcpus, memory_mib, boot_id, phase, reason, node,
        ssh_host, ssh_port, ssh_proxy_command, ssh_jump_host}``; missing status fields are None (phase "" when
        the controller has not written a status yet). ``boot_id`` is the boot the status
        describes (``status.bootID``), else the requested one (``spec.bootID``).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    endpoint = status.get("sshEndpoint") or {}
    boot = status.get("bootID")
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "labels": dict(meta.get("labels") or {}),
        "owner": spec.get("owner", ""),
        "vcpus": spec.get("vcpus"),
        "memory_mib": spec.get("memoryMiB"),
        "boot_id": boot if boot is not None else spec.get("bootID"),
        "phase": status.get("phase") or "",
        "reason": status.get("reason"),
        "node": status.get("node"),
        "ssh_host": endpoint.get("host"),
        "ssh_port": endpoint.get("port"),
        "ssh_proxy_command": status.get("sshProxyCommand"),
        "ssh_jump_host": status.get("sshJumpHost"),
    }


def pod_namespaces(items: Iterable[dict], namespaces: Iterable[str]) -> Optional[list[str]]:
    """Where the launcher Pods of CloudVM dicts ``items`` must be listed for :func:`launcher_checked`: None when no
    status says Running with a Pod (nothing to check, no request); else the configured ``namespaces`` that hold
    such a VM (one Pod list each), or ``[]`` (one cluster-wide list) when the CloudVMs were listed cluster-wide."""
    claiming = {(item.get("metadata") or {}).get("namespace", "") for item in items
                if launcher_pod.claimed_pod(item.get("status"))}
    if not claiming:
        return None
    namespaces = list(namespaces)
    return sorted(claiming & set(namespaces)) if namespaces else []


def launcher_checked(items: Iterable[dict], pods: Optional[dict]) -> tuple[list[dict], list[str]]:
    """The records (:func:`vm_record`) of the CloudVM dicts ``items``, each whose status says Running checked
    against its launcher Pod, and a warning per VM that fails the check.

    Args:
        items: CloudVM dicts as listed from the API server.
        pods: ``{(namespace, name): Pod dict}`` of the launcher Pods listed (:func:`model.launcher_pod.slim` is
            enough); None when they could not be listed (the records are then the statuses as written).

    Returns:
        ``(records, warnings)``. A record whose status says Running while its Pod ``status.pod`` is missing from
        ``pods``, being deleted or not Ready (:func:`model.launcher_pod.doubt`: the status is the controller's alone,
        and the controller may be down) gets ``phase`` ``Unknown`` and ``reason`` the doubt's (``LauncherPodGone``,
        ``LauncherPodTerminating``, ``LauncherPodNotReady``), so the default ``include_phases: [Running]`` leaves it
        out; its warning names the VM and why.
    """
    items = list(items)
    found = launcher_pod.doubts(items, pods) if pods is not None else {}
    records, warnings = [], []
    for item in items:
        rec = vm_record(item)
        why = found.get((rec["namespace"], rec["name"]))
        if why is not None:
            rec.update(phase="Unknown", reason=why.reason)
            warnings.append(f"CloudVM {rec['namespace']}/{rec['name']}: {why.message}; listed with phase "
                            "Unknown, not Running")
        records.append(rec)
    return records, warnings


def select(records: Iterable[dict], opts: InventoryOptions) -> list[dict]:
    """The records that pass the namespace, owner, label selector and phase filters, sorted by
    namespace and name (a stable inventory order)."""
    namespaces = set(opts.namespaces)
    owners = set(opts.owners)
    phases = set(opts.include_phases)
    out = []
    for rec in records:
        if namespaces and rec["namespace"] not in namespaces:
            continue
        if owners and rec["owner"] not in owners:
            continue
        if opts.selector and not all(req.matches(rec["labels"]) for req in opts.selector):
            continue
        if not opts.include_all and rec["phase"] not in phases:
            continue
        out.append(rec)
    out.sort(key=lambda r: (r["namespace"], r["name"]))
    return out


# --------------------------------------------------------------------------- hosts


@dataclass(frozen=True)
class HostEntry:
    """One inventory host: its name, variables and the built-in groups it belongs to."""

    name: str
    hostvars: dict
    groups: tuple[str, ...]


def group_name(kind: str, value: str) -> str:
    """``<kind>_<value>`` with every character other than letters, digits and ``_`` replaced by ``_``
    (Ansible group names must be valid variable names)."""
    return _GROUP_UNSAFE.sub("_", f"{kind}_{value}")


def _fields(rec: dict) -> dict:
    return {"namespace": rec["namespace"], "name": rec["name"], "owner": rec["owner"], "uid": rec["uid"],
            "node": rec["node"] or ""}


def ssh_common_args(rec: dict, opts: InventoryOptions) -> Optional[str]:
    """The ``ansible_ssh_common_args`` a VM needs, or None.

    With ``use_ssh_gateway`` the backend's ``sshJumpHost`` wins (host backend with its SSH gateway:
    ``zc-<owner>@<gateway>:<port>``, for clients outside the host), then its ``sshProxyCommand`` (host
    backend: the guests' bridge lives in a network namespace, reached with ``ip netns exec <ns> nc %h %p``
    from the host itself), then the ``jump_host`` option. The value is split by the ssh connection plugin
    with shlex, so the command is shell-quoted.
    """
    if opts.use_ssh_gateway and rec.get("ssh_jump_host"):
        return "-o " + shlex.quote("ProxyJump=" + rec["ssh_jump_host"])
    if opts.use_proxy_command and rec.get("ssh_proxy_command"):
        return "-o " + shlex.quote("ProxyCommand=" + rec["ssh_proxy_command"])
    if opts.jump_host:
        jump = opts.jump_host.format(**_fields(rec))
        return "-o " + shlex.quote("ProxyJump=" + jump)
    return None


def nested_name(opts: InventoryOptions) -> str:
    """The one variable of ``hostvars_layout: nested``: ``hostvar_prefix`` without its trailing ``_``
    (``cloudvm_`` gives ``cloudvm``)."""
    return opts.hostvar_prefix.rstrip("_")


def hostvars_for(rec: dict, opts: InventoryOptions) -> dict:
    """The host variables of one VM.

    ``ansible_user``, ``ansible_host``, ``ansible_port`` (from status.sshEndpoint) and
    ``ansible_ssh_common_args`` (:func:`ssh_common_args`) in both layouts; then the fields
    ``namespace name uid owner vcpus memory_mib node boot_id phase reason labels`` either each as
    ``<prefix><field>`` (``flat``) or together as one dict ``{field: value}`` under
    :func:`nested_name` (``nested``).
    """
    hv: dict = {"ansible_user": opts.ansible_user}
    if rec.get("ssh_host"):
        hv["ansible_host"] = rec["ssh_host"]
    if rec.get("ssh_port"):
        hv["ansible_port"] = rec["ssh_port"]
    args = ssh_common_args(rec, opts)
    if args:
        hv["ansible_ssh_common_args"] = args
    fields = {"namespace": rec["namespace"], "name": rec["name"], "uid": rec["uid"], "owner": rec["owner"],
              "vcpus": rec["vcpus"], "memory_mib": rec["memory_mib"], "node": rec["node"],
              "boot_id": rec["boot_id"], "phase": rec["phase"], "reason": rec["reason"], "labels": rec["labels"]}
    if opts.hostvars_layout == "nested":
        hv[nested_name(opts)] = fields
    else:
        p = opts.hostvar_prefix
        hv.update({p + key: value for key, value in fields.items()})
    return hv


def groups_for(rec: dict, opts: InventoryOptions) -> tuple[str, ...]:
    """Built-in groups of one VM, in ``group_by`` order; a VM without a node gets no node group."""
    out = []
    for kind in opts.group_by:
        value = rec["node"] if kind == "node" else rec[kind]
        if value:
            out.append(group_name(kind, str(value)))
    return tuple(out)


def host_entries(records: Iterable[dict], opts: InventoryOptions) -> tuple[list[HostEntry], list[str]]:
    """Hosts for the selected records (call :func:`select` first).

    Returns:
        ``(entries, warnings)``: when ``hostname_format`` maps two VMs to one name, the first (in
        namespace/name order) keeps it and a warning names the others, which are left out.
    """
    entries: list[HostEntry] = []
    seen: dict[str, str] = {}
    warnings: list[str] = []
    for rec in records:
        name = opts.hostname_format.format(**_fields(rec))
        ident = f"{rec['namespace']}/{rec['name']}"
        if name in seen:
            warnings.append(f"hostname_format {opts.hostname_format!r}: CloudVM {ident} has the same host name "
                            f"{name!r} as {seen[name]}; left out")
            continue
        seen[name] = ident
        entries.append(HostEntry(name, hostvars_for(rec, opts), groups_for(rec, opts)))
    return entries, warnings
