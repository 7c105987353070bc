# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``zjusct.cloud.cloudvm`` inventory plugin: running CloudVMs as Ansible hosts."""
# ruff: noqa: E402  (DOCUMENTATION and EXAMPLES come before the imports, as in every Ansible plugin)

from __future__ import annotations

DOCUMENTATION = r"""
name: cloudvm
short_description: CloudVMs of zjusct.cloud as inventory hosts
version_added: 0.1.0
description:
  - Lists CloudVMs and makes each selected VM an inventory host reachable over SSH, from one of two sources.
  - V(kubernetes) reads CloudVM custom resources (C(cloud.zjusct.io/v1alpha1)) from kube-apiserver with one
    paginated list per namespace (or one cluster-wide list), never one request per VM. The connection options and
    their E(K8S_AUTH_*) environment fallbacks are those of C(kubernetes.core).
  - V(host) reads the single-host backend's store (the SQLite file named by the host configuration that
    C(site.yml) writes) read-only, without taking its write lock, and derives each VM's phase from what runs (its
    launcher's lock and boot records) with the same function as C(zjusct.cloud.cloudvm_info), never from the
    status last stored. A store with an older schema is refused (run C(site.yml) to migrate it).
  - By default only VMs whose C(status.phase) is C(Running) (launcher alive and the guest's SSH answered) become
    hosts.
  - With V(kubernetes) the status is the controller's record alone, so a status that says C(Running) is checked
    against the launcher Pod it names (C(status.pod)), with one Pod list per namespace listed that holds such a VM
    (label selector C(app.kubernetes.io/name=zjusct-launcher); one cluster-wide list when O(namespaces) is empty).
    A VM whose launcher Pod is gone, being deleted or not C(Ready) (its node stopped reporting, and the controller
    that would record it may be down) gets C(phase) C(Unknown) and C(reason) C(LauncherPodGone),
    C(LauncherPodTerminating) or C(LauncherPodNotReady), so it is no host by default, and a warning names it and
    why. When the Pods cannot be listed (HTTP 403, the identity may not list Pods) one warning says so and the
    statuses are taken as written.
  - Host variables C(ansible_host) and C(ansible_port) come from C(status.sshEndpoint), C(ansible_user) from
    O(ansible_user). When the backend publishes C(status.sshProxyCommand) (the host backend does, its guests live
    on a bridge inside a network namespace) C(ansible_ssh_common_args) carries it as C(-o ProxyCommand=...);
    otherwise O(jump_host) adds a C(ProxyJump). With O(use_ssh_gateway) and a host backend running its SSH gateway
    (C(status.sshJumpHost), docs/security.md) it is C(-o ProxyJump=zc-<owner>@<gateway>:<port>) instead, for a
    client outside the hypervisor host.
  - Further host variables (each prefixed with O(hostvar_prefix), by default C(cloudvm_)) are C(namespace),
    C(name), C(uid), C(owner), C(vcpus), C(memory_mib) (MiB), C(node), C(boot_id), C(phase), C(reason) and
    C(labels) (a dict).
  - The configuration file name must end with C(cloudvm.yml) or C(cloudvm.yaml). Unknown keys are refused.
  - "With O(cache) enabled a run reads the cache; C(ansible-inventory --flush-cache), C(--flush-cache) on
    C(ansible-playbook) and C(meta: refresh_inventory) list again and rewrite the cache, so a refreshed inventory
    sees VMs started earlier in the same play."
  - A cache entry answers only for the scope it was listed for. The cache key and the entry cover the effective
    source and, for V(host), the host configuration and store paths and the effective uid; for V(kubernetes) the
    API server URL, O(namespaces), the selectors and a one-way fingerprint (SHA-256) of the identity (token,
    basic auth, client certificate, impersonation, kubeconfig context and user). The secret itself is never part
    of a key or a cache file. A run under another identity or host configuration lists as C(--flush-cache) would.
author:
  - ZJUSCT cloud team (@zjusct)
requirements:
  - PyYAML (ships with ansible-core).
  - For O(source=kubernetes) with an exec credential plugin, an auth-provider, O(proxy) or O(persist_config) the
    C(kubernetes.core) collection and the C(kubernetes) Python library; every other credential works with the
    Python standard library alone.
extends_documentation_fragment:
  - constructed
  - inventory_cache
options:
  plugin:
    description: Marks this file as a source for this plugin.
    required: true
    choices: [zjusct.cloud.cloudvm, cloudvm]
    type: str
  source:
    description:
      - Where the CloudVMs are read from.
      - V(kubernetes) lists CloudVM objects through kube-apiserver with the connection options below.
      - V(host) reads the host backend's store named by O(host_config).
      - The modules' C(backend) option names the same two with another default (V(host), E(ZJUSCT_CLOUD_BACKEND));
        set both variables, or O(source) here, to read the backend the modules act on (docs/architecture.md, "The
        backend choice").
    type: str
    choices: [kubernetes, host]
    default: kubernetes
    env:
      - name: ZJUSCT_CLOUD_INVENTORY_SOURCE
  host_config:
    description:
      - Host backend configuration (JSON) holding the store path; only for O(source=host).
      - When unset, E(ZJUSCT_CLOUD_CONFIG), then C(/etc/zjusct-cloud/host.json); a missing default file means the
        default store C(/var/lib/zjusct-cloud/cloud.db). A store that does not exist yet yields no hosts.
    type: path
  namespaces:
    description:
      - Namespaces to list CloudVMs from, one paginated list each.
      - Empty (the default) lists all namespaces with one cluster-wide list, which needs C(list) on CloudVMs at
        cluster scope; a tenant bound only in her namespace sets that namespace here.
    type: list
    elements: str
    default: []
  label_selector:
    description:
      - Kubernetes label selector, e.g. C(env=lab,tier in (web,db)). Sent to the server for
        O(source=kubernetes), evaluated by the plugin for O(source=host).
    type: str
    default: ""
  owners:
    description:
      - Only VMs whose C(spec.owner) is one of these user ids. With exactly one owner and O(source=kubernetes) the
        filter runs on the server (field selector C(spec.owner), a selectable field of the CRD).
    type: list
    elements: str
    default: []
    aliases: [owner]
  include_phases:
    description:
      - Phases whose VMs become hosts.
      - C(Running) means the launcher is alive for the current boot and the guest's SSH answered; VMs in other
        phases usually cannot be reached.
    type: list
    elements: str
    choices: [Pending, Running, Stopping, Stopped, Failed, Blocked, Unknown]
    default: [Running]
  include_all:
    description: Make every listed VM a host, whatever its phase (overrides O(include_phases)).
    type: bool
    default: false
  hostname_format:
    description:
      - Inventory host name of a VM, a Python format string over C({namespace}), C({name}), C({owner}), C({uid})
        and C({node}).
      - The default C({name}.{namespace}) is unique because neither a CloudVM name nor a namespace may contain a
        dot; C({namespace}-{name}) can map two VMs to one name (namespace C(a-b) VM C(c), namespace C(a) VM
        C(b-c)). When two VMs get the same name the first (by namespace, then name) keeps it and a warning names
        the others.
    type: str
    default: "{name}.{namespace}"
  hostvar_prefix:
    description:
      - Prefix of every host variable this plugin sets except the C(ansible_*) connection variables; the default
        gives C(cloudvm_owner), C(cloudvm_labels) and so on.
      - An empty prefix gives the bare names, but C(name) and C(namespace) are reserved variable names in Ansible
        (it warns) and C(node) or C(labels) easily collide with a site's own variables.
    type: str
    default: cloudvm_
  hostvars_layout:
    description:
      - How the VM's fields become host variables; the connection variables C(ansible_host), C(ansible_port),
        C(ansible_user) and C(ansible_ssh_common_args) are set the same way in both.
      - V(flat) sets one variable per field, C(<hostvar_prefix><field>), e.g. C(cloudvm_owner) and
        C(cloudvm_labels).
      - V(nested) sets one dict variable named O(hostvar_prefix) without its trailing C(_) (C(cloudvm) by
        default) holding the same fields under their bare names, e.g. C(cloudvm.owner) and C(cloudvm.labels);
        O(compose), O(groups) and O(keyed_groups) read it as C(cloudvm.memory_mib). It needs a O(hostvar_prefix)
        that is not empty.
      - Choose by what reads the variables, not for speed; on 10,000 hosts V(nested) was not faster
        (docs/inventory.md, "Speed").
    type: str
    choices: [flat, nested]
    default: flat
    version_added: 0.1.0
  group_by:
    description:
      - Built-in groups. V(owner) adds C(owner_<owner>), V(namespace) C(namespace_<namespace>), V(node)
        C(node_<node>), V(phase) C(phase_<phase>). Characters other than letters, digits and C(_) become C(_)
        (C(tenant-alice) gives C(namespace_tenant_alice)).
      - O(keyed_groups) and O(groups) build further groups from the host variables.
    type: list
    elements: str
    choices: [owner, namespace, node, phase]
    default: [owner, namespace, node]
  ansible_user:
    description: SSH user of the guests (the guest image authorises C(spec.sshAuthorizedKeys) for root).
    type: str
    default: root
  use_proxy_command:
    description: Use the C(status.sshProxyCommand) the backend publishes as C(-o ProxyCommand=...).
    type: bool
    default: true
  use_ssh_gateway:
    description:
      - Connect through the host backend's SSH gateway, C(status.sshJumpHost) (C(zc-<owner>@<gateway>:<port>)), as
        C(-o ProxyJump=...); for a client outside the hypervisor host, whose key is one of the VM's
        C(spec.sshAuthorizedKeys). Wins over O(use_proxy_command) for VMs that have it.
    type: bool
    default: false
  jump_host:
    description:
      - SSH jump host for VMs without a proxy command, as C([user@]host[:port]); may use the O(hostname_format)
        fields, e.g. C(root@{node}) to jump through the node that runs the VM. Set as C(-o ProxyJump=...) in
        C(ansible_ssh_common_args).
    type: str
    default: ""
  page_size:
    description: Objects per list request (C(limit)); the API server returns a C(continue) token for the rest.
    type: int
    default: 500
  request_timeout:
    description: Seconds to wait for connecting to and for each answer of the API server.
    type: float
    default: 30
  kubeconfig:
    description:
      - Path of a kubeconfig file (several joined with C(:)), or the kubeconfig as a dict. Without it and without
        O(host), the in-cluster service account is tried, then E(KUBECONFIG), then C(~/.kube/config).
    type: raw
    env:
      - name: K8S_AUTH_KUBECONFIG
  context:
    description: Context of the kubeconfig to use (default its current-context).
    type: str
    env:
      - name: K8S_AUTH_CONTEXT
  host:
    description: URL of the API server, e.g. C(https://192.0.2.10:6443).
    type: str
    env:
      - name: K8S_AUTH_HOST
  api_key:
    description: Bearer token for the API server. Never printed.
    type: str
    env:
      - name: K8S_AUTH_API_KEY
  username:
    description: User for basic authentication (with O(password)).
    type: str
    env:
      - name: K8S_AUTH_USERNAME
  password:
    description: Password for basic authentication. Never printed.
    type: str
    env:
      - name: K8S_AUTH_PASSWORD
  validate_certs:
    description: Whether to verify the API server's TLS certificate.
    type: bool
    aliases: [verify_ssl]
    env:
      - name: K8S_AUTH_VERIFY_SSL
      - name: K8S_AUTH_VALIDATE_CERTS
  ca_cert:
    description: CA certificate (PEM file) that signed the API server's certificate.
    type: path
    aliases: [ssl_ca_cert]
    env:
      - name: K8S_AUTH_SSL_CA_CERT
      - name: K8S_AUTH_CA_CERT
  client_cert:
    description: Client certificate (PEM file) for TLS client authentication.
    type: path
    aliases: [cert_file]
    env:
      - name: K8S_AUTH_CERT_FILE
      - name: K8S_AUTH_CLIENT_CERT
  client_key:
    description: Key (PEM file) of O(client_cert).
    type: path
    aliases: [key_file]
    env:
      - name: K8S_AUTH_KEY_FILE
      - name: K8S_AUTH_CLIENT_KEY
  proxy:
    description: HTTP proxy URL for the API server (uses the kubernetes Python client).
    type: str
    env:
      - name: K8S_AUTH_PROXY
  no_proxy:
    description: Comma separated hosts that bypass O(proxy).
    type: str
    env:
      - name: K8S_AUTH_NO_PROXY
  proxy_headers:
    description: Headers for O(proxy) (C(proxy_basic_auth), C(basic_auth), C(user_agent)), as in kubernetes.core.
    type: dict
  persist_config:
    description: Save refreshed tokens back to the kubeconfig (uses the kubernetes Python client).
    type: bool
    env:
      - name: K8S_AUTH_PERSIST_CONFIG
  impersonate_user:
    description: User to impersonate.
    type: str
    env:
      - name: K8S_AUTH_IMPERSONATE_USER
  impersonate_groups:
    description: Groups to impersonate.
    type: list
    elements: str
    env:
      - name: K8S_AUTH_IMPERSONATE_GROUPS
notes:
  - The host names, groups and variables are decided by pure functions in
    C(plugins/plugin_utils/_inventory.py); docs/inventory.md explains every option with examples, the AWX setup
    and the measured speed on 10,000 CloudVMs.
  - Values read from CloudVMs (labels, names) are data, never templates.
"""

EXAMPLES = r"""
# Four separate inventory files are shown; each is a file of its own.

# --- inventory/cloudvm.yml: the single-host cloud (source host)
# plugin: zjusct.cloud.cloudvm
# source: host

# --- inventory/kubernetes.cloudvm.yml: every Running CloudVM the kubeconfig user may list
plugin: zjusct.cloud.cloudvm
source: kubernetes
kubeconfig: ~/.kube/config
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/zjusct-cloud-inventory
cache_timeout: 300
keyed_groups:
  - key: cloudvm_labels['cloud.zjusct.io/course'] | default('none')
    prefix: course
compose:
  big: cloudvm_memory_mib >= 2048

# --- a tenant limited to her namespace, through a jump host on the VM's node
# plugin: zjusct.cloud.cloudvm
# namespaces: [tenant-alice]
# jump_host: "ops@{node}"

# --- one dict variable per host (cloudvm.owner, cloudvm.labels, ...) instead of one variable per field
# plugin: zjusct.cloud.cloudvm
# hostvars_layout: nested
# keyed_groups:
#   - key: cloudvm.labels['cloud.zjusct.io/course'] | default('none')
#     prefix: course
"""

import hashlib
import json
import os
import sqlite3
import time
from difflib import get_close_matches
from typing import Any, Optional

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible_collections.zjusct.cloud.plugins.module_utils.model import launcher_pod
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _inventory as inv
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _kube_list as kube

CACHE_FORMAT = 3  # 2: records carry ssh_jump_host; 3: Running records were checked against their launcher Pods


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    """Hosts from CloudVMs; the decisions live in plugin_utils/_inventory.py, the listing in _kube_list.py."""

    NAME = "zjusct.cloud.cloudvm"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(("cloudvm.yml", "cloudvm.yaml"))

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        config = self._read_config_data(path)
        self._refuse_unknown_keys(config)
        try:
            opts = inv.InventoryOptions.from_options(self.get_option)
        except inv.InventoryOptionError as exc:
            raise AnsibleParserError(f"{path}: {exc}") from None
        t0 = time.monotonic()
        records = self._records(path, cache, opts)
        t1 = time.monotonic()
        entries, warnings = inv.host_entries(inv.select(records, opts), opts)
        for warning in warnings:
            self.display.warning(warning)
        self._populate(entries)
        self.display.vvv(f"cloudvm inventory: {len(entries)} hosts from {len(records)} CloudVMs; listing "
                         f"{t1 - t0:.2f} s, building the inventory {time.monotonic() - t1:.2f} s")

    # ------------------------------------------------------------------ options

    def _refuse_unknown_keys(self, config: dict) -> None:
        known = set(self._options)
        aliases = {"owner", "verify_ssl", "ssl_ca_cert", "cert_file", "key_file"}
        unknown = sorted(set(config) - known - aliases)
        if unknown:
            hints = []
            for key in unknown:
                close = get_close_matches(key, sorted(known), n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise AnsibleParserError(f"unknown option {', '.join(hints)}; see ansible-doc -t inventory "
                                     f"zjusct.cloud.cloudvm")

    def _auth(self) -> dict:
        return {name: self.get_option(name) for name in kube.AUTH_OPTIONS}

    # ------------------------------------------------------------------ records and cache

    def _records(self, path: str, cache: bool, opts: inv.InventoryOptions) -> list[dict]:
        """The CloudVM records, from the cache when enabled and the entry is for the same scope.

        The cache key is the file's key plus a digest of the scope (:meth:`_scope`): the effective
        source, where it reads from and a fingerprint of the identity. A run under another host
        configuration or another Kubernetes identity therefore never answers from this entry; it
        lists like ``--flush-cache`` would.
        """
        use_cache = bool(self.get_option("cache"))
        source = self._host_source() if opts.source == "host" else self._kube_source()
        scope = self._scope(opts, source)
        digest = hashlib.sha256(json.dumps(scope, sort_keys=True).encode("utf-8")).hexdigest()[:16]
        key = f"{self.get_cache_key(path)}_{digest}"
        if use_cache and cache:
            try:
                cached = self._cache[key]
            except KeyError:
                cached = None
            if isinstance(cached, dict) and cached.get("format") == CACHE_FORMAT and cached.get("scope") == scope:
                self.display.vvv(f"cloudvm inventory: records from the cache entry {key}")
                return list(cached["records"])
        records = self._list_host(source) if opts.source == "host" else self._list_kubernetes(opts, source)
        if use_cache:
            # a fresh list (first run, expired entry, --flush-cache or meta: refresh_inventory) replaces the entry
            self._cache[key] = {"format": CACHE_FORMAT, "scope": scope, "records": records}
        return records

    def _scope(self, opts: inv.InventoryOptions, source: Any) -> dict:
        """What a cached listing depends on; never a secret (the identity is a one-way fingerprint).

        Host: the effective host configuration file, the store it names (absolute paths) and the
        effective uid. Kubernetes: the API server URL, the namespaces, the server-side selectors
        and :func:`_kube_list.identity_fingerprint` of the credentials.
        """
        if opts.source == "host":
            config_path, cfg = source
            return {"source": "host", "host_config": os.path.abspath(config_path),
                    "store": os.path.abspath(cfg.store_path), "uid": os.geteuid()}
        try:
            identity = kube.identity_fingerprint(source)
        except kube.KubeListError as exc:
            raise AnsibleParserError(f"source kubernetes: {exc}") from None
        return {"source": "kubernetes", "server": source.server, "namespaces": sorted(opts.namespaces),
                "label_selector": opts.label_selector, "field_selector": self._field_selector(opts),
                "identity": identity}

    @staticmethod
    def _field_selector(opts: inv.InventoryOptions) -> str:
        return f"spec.owner={opts.owners[0]}" if len(opts.owners) == 1 else ""

    def _host_source(self) -> tuple[str, Any]:
        """(effective host configuration path, loaded HostConfig) as every cloudvm module resolves them."""
        from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as _hostconfig

        config_path, _named = _hostconfig.resolve_path(self.get_option("host_config"))
        try:
            return config_path, _hostconfig.load(self.get_option("host_config"))
        except (OSError, ValueError) as exc:
            raise AnsibleParserError(f"source host: {exc}") from None

    def _kube_source(self) -> kube.Connection:
        try:
            return kube.resolve(self._auth())
        except kube.KubeListError as exc:
            raise AnsibleParserError(f"source kubernetes: {exc}") from None

    def _list_host(self, source: tuple[str, Any]) -> list[dict]:
        """Every VM of the host store with the phase cloudvm_info shows (derived from what runs now)."""
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.cloudvm import observed_vms
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import StoreError

        cfg = source[1]
        if not os.path.exists(cfg.store_path):
            self.display.warning(f"source host: the host store {cfg.store_path} does not exist yet (no VM was ever "
                                 f"created on this host): no hosts")
            return []
        try:
            vms = observed_vms(cfg, busy_timeout=10)
        except (StoreError, sqlite3.Error, OSError) as exc:
            raise AnsibleParserError(f"source host: cannot read the host store {cfg.store_path}: {exc}") from None
        return [inv.vm_record(vm) for vm in vms]

    def _list_kubernetes(self, opts: inv.InventoryOptions, conn: kube.Connection) -> list[dict]:
        auth = self._auth()
        timeout = float(self.get_option("request_timeout"))
        field_selector = self._field_selector(opts)
        try:
            if conn.needs_full_client:
                self.display.vvv(f"cloudvm inventory: using the kubernetes client ({conn.why_full_client})")
                get_json = kube.full_client_get_json(auth, timeout)
            else:
                get_json = kube.http_get_json(conn, timeout)
            items, requests = kube.list_objects(get_json, opts.namespaces, opts.label_selector, field_selector,
                                                int(self.get_option("page_size")))
        except kube.KubeListError as exc:
            raise AnsibleParserError(f"source kubernetes: {exc}") from None
        self.display.vvv(f"cloudvm inventory: {len(items)} CloudVMs in {requests} list requests")
        records, warnings = inv.launcher_checked(items, self._launcher_pods(get_json, items, opts))
        for warning in warnings:
            self.display.warning(warning)
        return records

    def _launcher_pods(self, get_json: kube.GetJson, items: list[dict],
                       opts: inv.InventoryOptions) -> Optional[dict]:
        """``{(namespace, name): Pod}`` of the launcher Pods (:data:`model.launcher_pod.LAUNCHER_SELECTOR`, each Pod
        reduced to what the check reads) where a listed status says Running (:func:`_inventory.pod_namespaces`: one
        paginated Pod list per such namespace, or one cluster-wide; none when no status says Running). None, with
        one warning, when they cannot be listed (403 without the right to list Pods, or any other failure): the
        statuses are then taken as written, as before the check existed."""
        namespaces = inv.pod_namespaces(items, opts.namespaces)
        if namespaces is None:
            return {}
        try:
            pods, requests = kube.list_objects(get_json, namespaces, launcher_pod.LAUNCHER_SELECTOR,
                                               page_size=int(self.get_option("page_size")),
                                               path=kube.pod_list_path, keep=launcher_pod.slim)
        except kube.KubeListError as exc:
            self.display.warning(f"source kubernetes: the launcher Pods could not be listed, so a CloudVM whose "
                                 f"status says Running is listed as Running without the check that its launcher Pod "
                                 f"is Ready: {exc}")
            return None
        self.display.vvv(f"cloudvm inventory: {len(pods)} launcher Pods in {requests} list requests")
        return {(p["metadata"].get("namespace", ""), p["metadata"].get("name", "")): p for p in pods}

    # ------------------------------------------------------------------ inventory

    def _populate(self, entries: list[inv.HostEntry]) -> None:
        inventory = self.inventory
        groups: set[str] = set()
        compose, conditional, keyed = (self.get_option("compose"), self.get_option("groups"),
                                       self.get_option("keyed_groups"))
        constructed = bool(compose or conditional or keyed)
        strict = self.get_option("strict")
        for entry in entries:
            inventory.add_host(entry.name)
            for var, value in entry.hostvars.items():
                inventory.set_variable(entry.name, var, value)
            for group in entry.groups:
                if group not in groups:
                    inventory.add_group(group)
                    groups.add(group)
                inventory.add_child(group, entry.name)
            if constructed:
                hostvars = inventory.get_host(entry.name).get_vars()
                try:
                    self._set_composite_vars(compose, hostvars, entry.name, strict=strict)
                    self._add_host_to_composed_groups(conditional, hostvars, entry.name, strict=strict)
                    self._add_host_to_keyed_groups(keyed, hostvars, entry.name, strict=strict)
                except AnsibleError as exc:
                    raise AnsibleParserError(f"host {entry.name}: {exc}") from None
