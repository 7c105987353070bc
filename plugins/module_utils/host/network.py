# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's network as the host store describes it: namespace, bridge and uplink (:func:`ensure_network`),
the isolation table from the store's leases (:func:`sync_isolation`), the SSH gateway's keys files from the VMs'
keys in effect (:func:`sync_gateway`), the TAPs of live launchers (:func:`live_taps`).

Used by the reconciler's network port (``host.ports.HostNetwork``), the cloudvm adapter (``host.cloudvm``) and the
body of ``zjusct.cloud.host_network`` (``host.host_network_module``)."""

from __future__ import annotations

import json
import os
import pwd
import stat
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net


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


def ensure_console_dir(cfg: HostConfig, check_mode: bool = False) -> bool:
    """Make ``cfg.console_dir``, where the guests' console sockets are: root:zjusct-gateway 0710 while the SSH
    gateway is on (its accounts reach their own sockets, owned by them, and cannot list the others), root:root 0700
    otherwise. Root's and writable by root alone, as the launcher requires before it hands a socket over.
    Returns whether it changed anything (in check mode: would change).

    Raises:
        GatewayError: the gateway's group cannot be created, or the path is not a directory. OSError: it cannot
            be made.
    """
    if check_mode:
        gid = gw.existing_group_id() if cfg.gateway_source() is not None else 0
        try:
            st = os.lstat(cfg.console_dir)
        except FileNotFoundError:
            return True
        return (st.st_uid, st.st_gid, st.st_mode & 0o7777) != (0, gid, 0o710 if gid else 0o700)
    gid = gw.group_id() if cfg.gateway_source() is not None else 0
    mode = 0o710 if gid else 0o700
    os.makedirs(cfg.runtime_dir, mode=0o755, exist_ok=True)
    changed = False
    try:
        os.mkdir(cfg.console_dir, 0o700)
        changed = True
    except FileExistsError:
        pass
    st = os.lstat(cfg.console_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise gw.GatewayError(f"runtime_dir (hypervisor_runtime_dir): {cfg.console_dir} is not a directory; remove it"
                              " (the guests' console sockets are made there)")
    if (st.st_uid, st.st_gid) != (0, gid):
        os.chown(cfg.console_dir, 0, gid, follow_symlinks=False)
        changed = True
    if st.st_mode & 0o7777 != mode:
        os.chmod(cfg.console_dir, mode)
        changed = True
    return changed


def serial_console(cfg: HostConfig, owner: str, namespace: str, name: str) -> dict:
    """The ``serialConsole`` of a boot of VM ``namespace/name`` (docs/tenants.md, "Serial console").

    The socket is :meth:`HostConfig.console_socket`; it belongs to the owner's gateway account (``zc-<owner>``,
    created here when missing) while the SSH gateway is on, so that only she (and root) attaches; to root
    otherwise (the operator's ``zjusct-launcher console``). Makes the directory (:func:`ensure_console_dir`).

    Raises:
        GatewayError: the account cannot be created. OSError: the directory cannot be made.
    """
    ensure_console_dir(cfg)
    uid = 0
    if cfg.gateway_source() is not None:
        account = gw.account_name(owner)
        gw.ensure_account(account, os.path.join(cfg.gateway_dir, gw.SHELL))
        uid = pwd.getpwnam(account).pw_uid
    return {"socketPath": cfg.console_socket(namespace, name), "uid": uid, "gid": 0}


def gateway_vms(cfg: HostConfig, store: HostStore) -> list[dict]:
    """``{"owner", "ipv4", "keys", "console"}`` of every VM in ``store`` holding an address lease
    (network.gateway.key_grants; ``console`` is ``[<namespace>/<name>, its console socket]``, None when the host's
    hypervisor has no console socket).

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
        meta = vm["metadata"]
        console = [f"{meta['namespace']}/{meta['name']}", cfg.console_socket(meta["namespace"], meta["name"])]
        # QEMU's console socket only (Firecracker's console is its own output)
        out.append({"owner": vm["spec"]["owner"], "ipv4": lease["ipv4"], "keys": keys,
                    "console": console if cfg.hypervisor == "qemu" else None})
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
