# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.host_network``: namespace, bridge, uplink, isolation, SSH gateway files, orphan TAP
sweep (the work itself: :mod:`host.network`)."""

from __future__ import annotations

import sqlite3

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import (
    ensure_console_dir,
    ensure_network,
    forwarding_warning,
    live_taps,
    sync_gateway,
    sync_isolation,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

# The failures run_host_network reports that are not CloudErrors already (NetworkError, GatewayError,
# StoreError are): the host configuration unreadable or invalid (OSError, ValueError), the host store busy past
# its timeout (sqlite3.Error). Anything else is a bug and keeps its traceback.
_PLAIN_ERRORS = (OSError, ValueError, sqlite3.Error)


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
    changed |= ensure_console_dir(cfg, check_mode)  # its group follows the gateway's on/off
    if cfg.gateway_source() is not None:
        problems = gw.launcher_problems(cfg.launcher_pythonpath)
        if problems and check_mode:
            changed = True  # the role's own tasks before this one may fix it
        elif problems:
            raise gw.GatewayError(
                f"launcher_pythonpath (hypervisor_launcher_dir): {cfg.launcher_pythonpath}: the SSH gateway's accounts"
                " run the launcher's console client from it as themselves (their login shell), so every directory"
                " down to it must be passable by others and it readable; " + "; ".join(problems)
                + ". Make them 0755 (the hypervisor role does for its own directories)")
        changed |= gw.ensure_gateway(cfg.gateway_dir, cfg.gateway_port,
                                     gw.shell_script(cfg.launcher_command, cfg.launcher_pythonpath), check_mode)
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
