# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.host_store``: create or migrate the host store (:mod:`host.store`)."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import (
    SCHEMA_VERSION,
    HostStore,
    StoreError,
    schema_version,
)


def run_host_store(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.host_store`` module: create the host store of ``host_config`` or migrate it to
    :data:`SCHEMA_VERSION` (opening a :class:`HostStore` does both); check mode only reads the version.

    Returns:
        ``{"changed", "path", "schema_version", "previous_schema_version"}`` (the last None for a new store).

    Raises:
        StoreError: the configuration or the store cannot be used (``field: host_config``, the message
            prefixed ``host_config:``).
    """
    try:
        cfg = load(params["host_config"])
        before = schema_version(cfg.store_path)
        changed = before is None or before < SCHEMA_VERSION
        if changed and not check_mode:
            HostStore(cfg.store_path).close()  # opening creates and migrates
    except (OSError, ValueError, StoreError) as exc:
        raise StoreError(f"host_config: {exc}", field="host_config") from exc
    return {"changed": changed, "path": cfg.store_path, "schema_version": SCHEMA_VERSION,
            "previous_schema_version": before}
