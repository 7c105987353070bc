# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``zjusct.cloud.host_network`` module's logic: namespace, bridge, uplink, isolation, SSH gateway files,
orphan TAP sweep."""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

# The failures run_host_network reports that are not CloudErrors already (NetworkError, GatewayError,
# StoreError are): the host configuration unreadable or invalid (OSError, ValueError), the host store busy past
# its timeout (sqlite3.Error). Anything else is a bug and keeps its traceback.
_PLAIN_ERRORS = (OSError, ValueError, sqlite3.Error)


def live_taps(cfg: HostConfig) -> set[str]:
    """TAP names of VMs whose launcher is alive (from the host store's leases and the launcher locks)."""
    if not os.path.exists(cfg.store_path):
        return set()
    keep = set()
    with HostStore(cfg.store_path) as store:
        leases = {lease["vm_uid"]: lease["tap"] for lease in store.leases()}
        for vm in store.list_vms():
            meta = vm["metadata"]
            paths = cfg.launcher_paths(meta["namespace"], meta["name"])
            if meta["uid"] in leases and sup.running_boot(paths) is not None:
                keep.add(leases[meta["uid"]])
    return keep


def owner_groups(store: HostStore) -> dict:
    """owner -> leases (``tap``, ``mac``, ``ipv4``) of that owner's VMs in ``store``
    (network.hostnet.isolation_elements)."""
    groups: dict = {}
    owners = {vm["metadata"]["uid"]: vm["spec"]["owner"] for vm in store.list_vms()}
    for lease in store.leases():
        groups.setdefault(owners.get(lease["vm_uid"], "?"), []).append(lease)
    return groups


def sync_isolation(cfg: HostConfig, store: Optional[HostStore] = None) -> bool:
    """Make the isolation table in ``cfg.netns`` match the leases committed in the host store.

    The store is read and the table changed under one host-wide flock (``<state_dir>/locks/isolation.lock``):
    :func:`network.hostnet.apply_isolation` computes a diff against the table, so two runs reading the store
    outside the lock could each apply an older view and delete an element the other just added (a
    started guest left out of its owner's set is cut off from the gateway). Call it after committing
    the lease change.

    Args:
        store: an open store (read without a transaction); ``None`` opens ``cfg.store_path`` (no store
            file = no guests).

    Returns:
        Whether the table changed.

    Raises:
        NetworkError: nft failed.
    """
    directory = os.path.join(cfg.state_dir, "locks")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with _flock.exclusive(os.path.join(directory, "isolation.lock")):
        if store is not None:
            return net.apply_isolation(cfg.netns, owner_groups(store))
        if not os.path.exists(cfg.store_path):
            return net.apply_isolation(cfg.netns, {})
        with HostStore(cfg.store_path) as opened:
            return net.apply_isolation(cfg.netns, owner_groups(opened))


def gateway_gid(cfg: HostConfig) -> Optional[int]:
    """The gid of the SSH gateway's group (created if missing) when the gateway is on, else None."""
    return gw.group_id() if cfg.gateway_source() is not None else None


def ensure_network(cfg: HostConfig) -> bool:
    """Namespace, bridge and guard table, and the uplink when ``cfg.nat`` (with the gateway's rules when it is
    on). Returns whether anything changed. Raises NetworkError, GatewayError."""
    changed = net.ensure_bridge(cfg.netns, cfg.bridge, cfg.subnet, cfg.gateway_source())
    if cfg.nat:
        changed |= net.ensure_uplink(cfg.netns, cfg.subnet, cfg.uplink_cidr, cfg.uplink_netns,
                                     cfg.uplink_ip_forward, gateway_gid(cfg))
    return changed


def running_boot_keys(paths: sup.LauncherPaths, locks: Optional[sup.LockTable] = None) -> Optional[list]:
    """``identity.sshAuthorizedKeys`` of the LauncherConfig of the boot this VM's guest runs, None when none runs.

    The boot that runs is the one whose launcher holds the VM's lock (:func:`host.supervisor.running_boot`), else
    the newest boot on disk while it is starting (spawned, lock not taken yet: :func:`host.supervisor.observe`).
    A config that cannot be read counts as no boot (the spec's keys then apply).
    """
    live = sup.running_boot(paths, locks)
    known = sup.boots(paths)
    boot: Optional[int] = None
    if live is not None:
        boot = live[0] if live[0] >= 0 else (known[-1] if known else None)
    elif known and sup.observe(paths, known[-1], locks=locks).state == "starting":
        boot = known[-1]
    if boot is None:
        return None
    try:
        with open(paths.config(boot), encoding="utf-8") as fh:
            keys = (json.load(fh).get("identity") or {}).get("sshAuthorizedKeys")
    except (OSError, ValueError):
        return None
    return list(keys) if isinstance(keys, list) else None


def gateway_vms(cfg: HostConfig, store: HostStore) -> list[dict]:
    """``{"owner", "ipv4", "keys"}`` of every VM in ``store`` holding an address lease (network.gateway.key_grants).

    ``keys`` are the VM's keys in effect (:func:`network.gateway.keys_in_effect`): those of the boot its guest
    runs (:func:`running_boot_keys`), else its spec's. The kernel's lock table is read once for all VMs.
    """
    vms = {vm["metadata"]["uid"]: vm for vm in store.list_vms()}
    leases = [lease for lease in store.leases() if lease["vm_uid"] in vms]
    locks = sup.lock_table() if leases else None
    out = []
    for lease in leases:
        vm = vms[lease["vm_uid"]]
        paths = cfg.launcher_paths(vm["metadata"]["namespace"], vm["metadata"]["name"])
        keys = gw.keys_in_effect(vm["spec"].get("sshAuthorizedKeys"), running_boot_keys(paths, locks))
        out.append({"owner": vm["spec"]["owner"], "ipv4": lease["ipv4"], "keys": keys})
    return out


def sync_gateway(cfg: HostConfig, store: Optional[HostStore] = None, check_mode: bool = False) -> bool:
    """Rewrite the SSH gateway's keys files from the VMs' keys in effect and leases (no-op without a gateway).

    Call it after committing a lease, a key change or a deletion, and when a boot starts or is seen to have ended
    (host.ports.HostNetwork attach/detach; network.gateway.sync_keys: atomic, under
    ``<state_dir>/locks/gateway.lock``). A key change of a VM whose boot runs changes nothing here: that boot's keys
    stay until it ends (:func:`gateway_vms`). ``store``: an open store; None opens ``cfg.store_path``.
    ``check_mode``: only report whether a file would change.

    Returns whether a keys file changed. Raises GatewayError.
    """
    if cfg.gateway_source() is None:
        return False
    lock_dir = os.path.join(cfg.state_dir, "locks")
    if store is not None:
        return gw.sync_keys(cfg.gateway_dir, lock_dir, gateway_vms(cfg, store), check_mode)
    if not os.path.exists(cfg.store_path):
        return gw.sync_keys(cfg.gateway_dir, lock_dir, [], check_mode)
    with HostStore(cfg.store_path, read_only=check_mode) as opened:
        return gw.sync_keys(cfg.gateway_dir, lock_dir, gateway_vms(cfg, opened), check_mode)


def forwarding_warning(cfg: HostConfig) -> list[str]:
    """A warning when guests' NAT cannot leave the host: the uplink's outer side does not forward."""
    if not cfg.nat or not cfg.netns or net.uplink_forwarding(cfg.uplink_netns):
        return []
    where = f"namespace {cfg.uplink_netns}" if cfg.uplink_netns else "the host's namespace"
    return [f"net.ipv4.ip_forward is 0 in {where}: guests reach the uplink ({cfg.uplink_cidr}) but are not routed"
            " beyond it. The cloud does not change it on its own; set hypervisor_uplink_ip_forward: true"
            " (host config uplink_ip_forward) or enable forwarding yourself (docs/network.md)."]


def run_host_network(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.host_network`` module: :func:`ensure_host_network`, its plain failures (host
    configuration, sqlite) turned into :class:`common.errors.CloudError` with the same message."""
    try:
        return ensure_host_network(params, check_mode)
    except CloudError:
        raise
    except _PLAIN_ERRORS as exc:
        raise CloudError(str(exc)) from exc


def ensure_host_network(params: dict, check_mode: bool) -> dict:
    """Ensure the bridge, uplink and isolation tables, and the SSH gateway's files when ``gateway_dir`` is
    set (:func:`network.gateway.ensure_gateway`, :func:`sync_gateway`); sweep orphaned TAPs.

    Returns ``changed``, ``removed_taps``, ``warnings`` (see :func:`forwarding_warning`) and, with the gateway on,
    ``gateway_known_hosts`` (:func:`network.gateway.known_hosts_line`).

    Raises:
        NetworkError, GatewayError, StoreError, OSError, ValueError (the host configuration) or sqlite3.Error,
        with a message naming the setting or command that failed.
    """
    cfg = load(params.get("host_config"))
    changed = False
    if check_mode:
        changed = not net.netns_exists(cfg.netns) or not net.link_exists(cfg.netns, cfg.bridge)
    else:
        changed = ensure_network(cfg)
    if cfg.gateway_source() is not None:
        changed |= gw.ensure_gateway(cfg.gateway_dir, cfg.gateway_port, check_mode)
        changed |= sync_gateway(cfg, check_mode=check_mode)
    removed: list[str] = []
    if params.get("sweep") and net.netns_exists(cfg.netns):
        keep = live_taps(cfg)
        removed = [t for t in net.list_taps(cfg.netns) if t not in keep]
        if not check_mode:
            for tap in removed:
                net.remove_tap(cfg.netns, tap)
            changed |= sync_isolation(cfg)
    warnings = forwarding_warning(cfg) if net.netns_exists(cfg.netns) else []
    out = {"changed": changed or bool(removed), "removed_taps": removed, "warnings": warnings}
    if cfg.gateway_source() is not None:
        known = gw.known_hosts_line(cfg.gateway_dir, cfg.gateway_host or cfg.node, cfg.gateway_port)
        if known is not None:
            out["gateway_known_hosts"] = known
    return out
