# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host store: the single-host backend's database (SQLite).

It holds CloudVM records (same spec/status shape as the CRD), root volumes with their ownership
marks, resource allocations, IPv4 leases, an event log, per-owner quotas and the audit trail of
mutating actions. Several ansible runs may use it at
once: every change happens inside :meth:`HostStore.transaction`, which takes SQLite's write lock
up front (``BEGIN IMMEDIATE``) so read-modify-write sequences never lose updates, and waits up to
``busy_timeout`` seconds for another writer (https://www.sqlite.org/lang_transaction.html).

The schema is versioned with ``PRAGMA user_version`` and migrated forward on open; a database
newer than this code is refused rather than damaged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import urllib.parse
import uuid
from typing import Any, Callable, ContextManager, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.common.sqlite import (
    insert_event,
    now,
    now_precise,
    write_transaction,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import LIMITS as QUOTA_LIMITS
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import usage as quota_usage
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import API_VERSION, KIND

DEFAULT_PATH = "/var/lib/zjusct-cloud/cloud.db"


class AddColumn(tuple):
    """A migration step ``ALTER TABLE <table> ADD COLUMN <column> <decl>``, skipped when the column exists (so a
    step that was applied before its ``user_version`` was written, or a store whose version was set back, migrates
    again without error; SQLite has no ``ADD COLUMN IF NOT EXISTS``)."""

    def __new__(cls, table: str, column: str, decl: str) -> "AddColumn":
        return super().__new__(cls, (table, column, decl))


# Each entry upgrades the schema from version i to i + 1. Never edit a released entry: append. A step is an SQL
# statement or an :class:`AddColumn`.
# Every table of the database is created here, the QoS state's (host.qos_store) included; no other module runs DDL.
# The event log (``events``): ``kind`` Normal|Warning (as Kubernetes Events), ``subject`` what the event is about
# (:data:`SUBJECTS`), ``reason`` one CamelCase word, ``data`` a JSON object.
MIGRATIONS: tuple[tuple[Any, ...], ...] = (
    (
        """CREATE TABLE cloudvms (
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            uid TEXT NOT NULL UNIQUE,
            owner TEXT NOT NULL,
            spec TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT '{}',
            labels TEXT NOT NULL DEFAULT '{}',
            generation INTEGER NOT NULL DEFAULT 1,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (namespace, name))""",
        """CREATE TABLE volumes (
            name TEXT PRIMARY KEY,
            driver TEXT NOT NULL,
            location TEXT NOT NULL,
            size_mib INTEGER NOT NULL,
            owner TEXT NOT NULL,
            claimed_by TEXT,
            image TEXT,
            created_at TEXT NOT NULL)""",
        """CREATE TABLE allocations (
            vm_uid TEXT PRIMARY KEY,
            node TEXT NOT NULL,
            vcpus INTEGER NOT NULL,
            memory_mib INTEGER NOT NULL,
            disk_mib INTEGER NOT NULL,
            bandwidth_mbps INTEGER NOT NULL)""",
        """CREATE TABLE leases (
            ipv4 TEXT PRIMARY KEY,
            vm_uid TEXT NOT NULL UNIQUE,
            mac TEXT NOT NULL,
            tap TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}')""",
        "CREATE INDEX IF NOT EXISTS events_subject ON events (subject, id)",
    ),
    # 2: bandwidth QoS state of host.qos_store: node capacity, pools, grants (one per admitted VM), TAP attachments.
    (
        """CREATE TABLE IF NOT EXISTS qos_node (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        nic_mbps INTEGER NOT NULL,
        ratio REAL NOT NULL,
        next_seq INTEGER NOT NULL DEFAULT 1)""",
        """CREATE TABLE IF NOT EXISTS qos_pools (
        name TEXT PRIMARY KEY,
        capacity_mbps INTEGER NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS qos_grants (
        vm TEXT PRIMARY KEY,
        pool TEXT NOT NULL,
        guaranteed_mbps INTEGER NOT NULL,
        ceil_mbps INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        granted_mbps INTEGER NOT NULL,
        seq INTEGER NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS qos_attachments (
        vm TEXT PRIMARY KEY,
        netns TEXT NOT NULL,
        device TEXT NOT NULL,
        ifb TEXT NOT NULL,
        mac TEXT,
        ipv4 TEXT,
        minor INTEGER NOT NULL,
        UNIQUE (netns, device, minor))""",
    ),
    # 3: per-owner quotas and the audit trail (docs/security.md, "Quotas" and "Audit").
    (
        """CREATE TABLE IF NOT EXISTS quotas (
            owner TEXT PRIMARY KEY,
            vms INTEGER,
            vcpus INTEGER,
            memory_mib INTEGER,
            disk_mib INTEGER,
            bandwidth_mbps INTEGER,
            updated_at TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            ts TEXT NOT NULL,
            actor TEXT NOT NULL,
            operator INTEGER NOT NULL DEFAULT 0,
            action TEXT NOT NULL,
            subject TEXT NOT NULL,
            owner TEXT NOT NULL DEFAULT '',
            result TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            message TEXT NOT NULL DEFAULT '',
            data TEXT NOT NULL DEFAULT '{}')""",
        "CREATE INDEX IF NOT EXISTS audit_owner ON audit (owner, id)",
        "CREATE INDEX IF NOT EXISTS audit_subject ON audit (subject, id)",
    ),
    # 4: an audit record is written as the intent in the transaction of the change, its outcome later
    # (AuditTrail); ``ended`` is when the outcome was recorded, NULL while the result is ``requested``.
    (
        AddColumn("audit", "ended", "TEXT"),
        "UPDATE audit SET ended = ts WHERE ended IS NULL AND result != 'requested'",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

# Event subjects, one per kind of thing: what ``HostStore.events(subject)`` selects by.
SUBJECTS = {
    "CloudVM": "<namespace>/<name>",  # lifecycle, placement, volume claims and bandwidth decisions of the VM
    "node": "<node name>",  # water levels
    "volume": "<volume name>",  # host_volume adoptions
    "bandwidth of a VM outside the store": "vm/<name>",  # tc_qos requests with store_path (no CloudVM)
}


class StoreError(CloudError):
    """The host store cannot be used (unreadable, newer schema, constraint violated)."""


def _apply(conn: sqlite3.Connection, step: Any) -> None:
    """Run one migration step (an SQL statement, or an :class:`AddColumn` unless its column exists)."""
    if isinstance(step, AddColumn):
        table, column, decl = step
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        return
    conn.execute(step)


def _connect_read_only(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A ``mode=ro`` connection to an existing store whose schema is exactly :data:`SCHEMA_VERSION`."""
    if not os.path.exists(path):
        raise StoreError(f"host store {path} does not exist")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open host store {path} for reading: {exc}") from exc
    if version != SCHEMA_VERSION:
        conn.close()
        if version > SCHEMA_VERSION:
            raise StoreError(f"host store {path} has schema version {version}, newer than this collection's "
                             f"{SCHEMA_VERSION}: upgrade the collection")
        raise StoreError(f"host store {path} has schema version {version}, older than this collection's "
                         f"{SCHEMA_VERSION}: run site.yml to migrate it (listing never writes the store)")
    return conn


def schema_version(path: str) -> Optional[int]:
    """The schema version (``PRAGMA user_version``) of the store at ``path``, or None when it does not exist.

    Reads without migrating or taking a write lock (a ``mode=ro`` connection).

    Raises:
        StoreError: the file exists but is not a readable SQLite database.
    """
    if not os.path.exists(path):
        return None
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read host store {path}: {exc}") from exc


class Interrupted(CloudError):
    """The module run got SIGTERM (an AWX job cancelled, ``ansible-playbook`` stopped) before it ended."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into :class:`Interrupted` while the block runs, so that a stopped run still records its outcome
    (a write transaction it was in rolls back). Only in the main thread (elsewhere: unchanged).

    A process forked meanwhile without exec (a library's helper child) inherits the handler; there SIGTERM ends
    the child at once (``os._exit``) instead of raising into its copy of this run's stack."""
    installer = os.getpid()

    def interrupted(signum: int, frame: Any) -> None:
        if os.getpid() != installer:
            os._exit(128 + signum)
        raise Interrupted("the run was stopped by SIGTERM before it ended; what it had changed stays in the store"
                          " (docs/security.md, \"Audit\")", reason="Interrupted")

    try:
        previous = signal.signal(signal.SIGTERM, interrupted)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class AuditTrail:
    """The audit record of one mutating module run (docs/security.md, "Audit").

    A run that changes the store records its *intent* (:meth:`intend`, ``result: requested``) inside the write
    transaction of that change, so the record and the change are committed together: a run killed afterwards, even
    by SIGKILL, leaves the record of what it changed. Its outcome (:meth:`finish`: ``succeeded``, ``refused`` or
    ``failed``) then completes the same record (``ended`` set). A run refused or failed before it changed anything
    gets one record with its outcome only.

    Args:
        store: the host store the record goes to.
        actor, action, subject, owner, operator, data: the record's columns (:meth:`HostStore.record_audit`).
    """

    def __init__(self, store: "HostStore", actor: str, action: str, subject: str, *, owner: str = "",
                 operator: bool = False, data: Optional[dict] = None) -> None:
        self.store, self.actor, self.action, self.subject = store, actor, action, subject
        self.owner, self.operator, self.data = owner, operator, dict(data or {})
        self.id: Optional[int] = None

    def intend(self, message: str, data: Optional[dict] = None) -> None:
        """Record the intent (once per run; later calls do nothing). Call it inside the write transaction of the
        change it describes (it joins that transaction)."""
        if self.id is None:
            self.data.update(data or {})
            self.id = self.store.record_audit(self.actor, self.action, self.subject, "requested", message,
                                              owner=self.owner, operator=self.operator, data=self.data, ended=False)

    def finish(self, result: str, message: str, reason: str = "", data: Optional[dict] = None) -> None:
        """Record the outcome: complete the intent's record, or append one when no intent was recorded.

        Args:
            result: ``succeeded``, ``refused`` or ``failed``.
            message, reason: what was done, or why not.
            data: more fields for the record's data.
        """
        self.data.update(data or {})
        if self.id is None:
            self.id = self.store.record_audit(self.actor, self.action, self.subject, result, message,
                                              owner=self.owner, operator=self.operator, reason=reason, data=self.data)
        else:
            self.store.finish_audit(self.id, result, message, owner=self.owner, reason=reason, data=self.data)


def audited(body: Callable[[], dict], record: Callable[..., None], check_mode: bool = False,
            trail: Optional[AuditTrail] = None) -> dict:
    """Run a mutating module body and audit its outcome (docs/security.md, "Audit").

    ``record(result=...)`` is called when the body's result has ``changed`` (or ``trail`` recorded an intent),
    ``record(error=...)`` when the body raises (a refusal or a failure, SIGTERM included: it raises
    :class:`Interrupted` while the body runs), never in check mode and never for a run that changed nothing. A
    record that cannot be written after a failure never hides the failure itself.

    Returns:
        ``body()``'s result.

    Raises:
        Whatever ``body`` raises (after recording it), :class:`Interrupted` on SIGTERM; StoreError / sqlite3.Error
        when recording a success fails.
    """
    if check_mode:
        return body()
    try:
        with _sigterm_raises():
            result = body()
    except Exception as exc:
        with contextlib.suppress(StoreError, sqlite3.Error):
            record(error=exc)
        raise
    if result.get("changed") or (trail is not None and trail.id is not None):
        record(result=result)
    return result


class HostStore:
    """A connection to the host store at ``path`` (created with its directory, mode 0700).

    Args:
        path: database file path.
        busy_timeout: seconds to wait for another writer's lock before failing (default 120: a boot's write
            transaction holds the bandwidth's kernel work, milliseconds when idle but seconds on a loaded host;
            a concurrent run waits for it instead of failing "database is locked").
        read_only: open for reading only (``cloudvm_info``, the inventory): SQLite URI ``mode=ro``,
            no directory or file is created, no migration runs and no write lock is ever taken, so a
            listing succeeds while another process holds a write transaction (WAL readers never wait
            for the writer, https://www.sqlite.org/wal.html). Every write method then fails.

    Raises:
        StoreError: the database cannot be opened or has a newer schema than this code; read-only:
            also when the file does not exist or its schema is older than this code (running
            ``site.yml`` migrates it).
    """

    def __init__(self, path: str = DEFAULT_PATH, busy_timeout: float = 120.0, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        if read_only:
            self.conn = _connect_read_only(path, busy_timeout)
            return
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        try:
            self.conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open host store {path}: {exc}") from exc
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        self._migrate()

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> "HostStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"host store {self.path} has schema version {version}, newer than this collection's "
                    f"{SCHEMA_VERSION}: upgrade the collection")
            for target in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[target]:
                    _apply(conn, statement)
                conn.execute(f"PRAGMA user_version={target + 1}")

    def transaction(self) -> ContextManager[sqlite3.Connection]:
        """Run a block in one write transaction (``BEGIN IMMEDIATE``), committed on success.

        Nested use joins the outer transaction.
        """
        return write_transaction(self.conn)

    # --- events -------------------------------------------------------------------------------
    def record_event(self, kind: str, subject: str, reason: str, message: str,
                     data: Optional[dict] = None) -> None:
        """Append an event (``kind`` Normal|Warning, ``subject`` e.g. ``default/alice``)."""
        insert_event(self.conn, kind, subject, reason, message, data)

    def events(self, subject: Optional[str] = None, limit: int = 100) -> list[dict]:
        """The newest ``limit`` events (for ``subject`` if given), oldest first."""
        if subject is None:
            rows = self.conn.execute("SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        else:
            rows = self.conn.execute("SELECT * FROM events WHERE subject = ? ORDER BY id DESC LIMIT ?",
                                     (subject, limit)).fetchall()
        return [dict(r, data=json.loads(r["data"])) for r in reversed(rows)]

    # --- quotas and audit (docs/security.md) ---------------------------------------------------
    def get_quota(self, owner: str) -> Optional[dict]:
        """The quota of ``owner`` (limit name -> int, or None for unlimited), or None when it has none."""
        row = self.conn.execute("SELECT * FROM quotas WHERE owner = ?", (owner,)).fetchone()
        return {k: row[k] for k in QUOTA_LIMITS} if row else None

    def list_quotas(self) -> dict:
        """Every owner's quota: owner -> limits (as :meth:`get_quota`)."""
        rows = self.conn.execute("SELECT * FROM quotas ORDER BY owner").fetchall()
        return {r["owner"]: {k: r[k] for k in QUOTA_LIMITS} for r in rows}

    def put_quota(self, owner: str, limits: Optional[dict]) -> None:
        """Set (``limits``: limit name -> int or None) or remove (None) the quota of ``owner``."""
        with self.transaction() as conn:
            if limits is None:
                conn.execute("DELETE FROM quotas WHERE owner = ?", (owner,))
                return
            conn.execute("INSERT OR REPLACE INTO quotas (owner, vms, vcpus, memory_mib, disk_mib, bandwidth_mbps,"
                         " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (owner, *(limits.get(k) for k in QUOTA_LIMITS), now()))

    def owner_usage(self, owner: str) -> dict:
        """What ``owner`` uses now against its quota (:func:`model.quota.usage`: every CloudVM and volume of it)."""
        specs = [json.loads(r["spec"]) for r in
                 self.conn.execute("SELECT spec FROM cloudvms WHERE owner = ?", (owner,)).fetchall()]
        sizes = [r["size_mib"] for r in
                 self.conn.execute("SELECT size_mib FROM volumes WHERE owner = ?", (owner,)).fetchall()]
        return quota_usage(specs, sizes)

    def record_audit(self, actor: str, action: str, subject: str, result: str, message: str = "", *,
                     owner: str = "", operator: bool = False, reason: str = "",
                     data: Optional[dict] = None, ended: bool = True) -> int:
        """Append an audit record (schema in docs/security.md, "Audit") and return its id.

        Args:
            actor: who acted (the module's ``owner`` option, or ``operator`` for a task without one).
            action: create, start, stop, restart, update, delete, volume-register, quota-set, quota-remove,
                backup, restore.
            subject: ``namespace/name`` of a CloudVM, ``volume/<name>``, ``quota/<owner>``, ``rbd/<pool>/<image>``.
            result: succeeded, refused (Forbidden, QuotaExceeded), failed, or requested (an intent whose outcome
                is recorded later, :class:`AuditTrail`).
            message: what was done or why not.
            owner: the owner of the subject (what an owner's audit listing filters on).
            operator: the operator switch was set.
            reason: the refusal's or failure's reason (``QuotaExceeded``, ``Forbidden``...).
            data: extra JSON fields (the options that mattered).
            ended: the outcome is known (``ended`` = ``ts``); False for an intent.
        """
        ts = now_precise()
        with self.transaction() as conn:
            cur = conn.execute("INSERT INTO audit (ts, actor, operator, action, subject, owner, result, reason,"
                               " message, data, ended) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (ts, actor, int(bool(operator)), action, subject, owner, result, reason, message,
                                json.dumps(data or {}, sort_keys=True), ts if ended else None))
            return int(cur.lastrowid or 0)

    def finish_audit(self, record_id: int, result: str, message: str, *, owner: str, reason: str = "",
                     data: Optional[dict] = None) -> None:
        """Complete the intent record ``record_id`` with its outcome (``ended`` = now); see :class:`AuditTrail`."""
        with self.transaction() as conn:
            conn.execute("UPDATE audit SET result = ?, reason = ?, message = ?, owner = ?, data = ?, ended = ?"
                         " WHERE id = ?", (result, reason, message, owner, json.dumps(data or {}, sort_keys=True),
                                           now_precise(), record_id))

    def audit(self, owner: Optional[str] = None, actor: Optional[str] = None, subject: Optional[str] = None,
              since: Optional[str] = None, limit: int = 100) -> list[dict]:
        """The newest ``limit`` audit records matching every filter given, oldest first.

        ``since`` is an RFC 3339 UTC time (``2026-11-30T07:00:00Z``); records at or after it match.
        """
        query, args = "SELECT * FROM audit WHERE 1=1", []
        for column, value in (("owner", owner), ("actor", actor), ("subject", subject)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        if since is not None:
            query += " AND ts >= ?"
            args.append(since)
        rows = self.conn.execute(query + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [dict(r, operator=bool(r["operator"]), data=json.loads(r["data"])) for r in reversed(rows)]

    # --- CloudVMs -----------------------------------------------------------------------------
    @staticmethod
    def _vm(row: sqlite3.Row) -> dict:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "namespace": row["namespace"], "name": row["name"], "uid": row["uid"],
                "generation": row["generation"], "creationTimestamp": row["created_at"],
                "labels": json.loads(row["labels"]),
            },
            "spec": json.loads(row["spec"]),
            "status": json.loads(row["status"]),
        }

    def get_vm(self, namespace: str, name: str) -> Optional[dict]:
        """The CloudVM ``namespace/name`` as a CRD-shaped dict, or None."""
        row = self.conn.execute("SELECT * FROM cloudvms WHERE namespace = ? AND name = ?",
                                (namespace, name)).fetchone()
        return self._vm(row) if row else None

    def list_vms(self, namespace: Optional[str] = None, owner: Optional[str] = None) -> list[dict]:
        """All CloudVMs, optionally only one namespace's and/or one owner's, ordered by name."""
        query, args = "SELECT * FROM cloudvms WHERE 1=1", []
        if namespace is not None:
            query += " AND namespace = ?"
            args.append(namespace)
        if owner is not None:
            query += " AND owner = ?"
            args.append(owner)
        rows = self.conn.execute(query + " ORDER BY namespace, name", args).fetchall()
        return [self._vm(r) for r in rows]

    def create_vm(self, namespace: str, name: str, spec: dict, labels: Optional[dict] = None) -> dict:
        """Insert a new CloudVM with a fresh uid and an empty status; returns it.

        Raises:
            StoreError: a CloudVM with that name exists.
        """
        ts = now()
        try:
            with self.transaction() as conn:
                conn.execute(
                    "INSERT INTO cloudvms (namespace, name, uid, owner, spec, labels, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (namespace, name, str(uuid.uuid4()), spec["owner"], json.dumps(spec, sort_keys=True),
                     json.dumps(labels or {}, sort_keys=True), ts, ts))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"CloudVM {namespace}/{name} already exists") from exc
        vm = self.get_vm(namespace, name)
        if vm is None:
            raise AssertionError("vm unexpectedly missing")
        return vm

    def update_vm(self, namespace: str, name: str, spec: Optional[dict] = None,
                  status: Optional[dict] = None, labels: Optional[dict] = None) -> None:
        """Replace the spec (bumping ``generation``), the status and/or the labels."""
        with self.transaction() as conn:
            if spec is not None:
                conn.execute("UPDATE cloudvms SET spec = ?, generation = generation + 1, updated_at = ?"
                             " WHERE namespace = ? AND name = ?",
                             (json.dumps(spec, sort_keys=True), now(), namespace, name))
            if status is not None:
                conn.execute("UPDATE cloudvms SET status = ?, updated_at = ? WHERE namespace = ? AND name = ?",
                             (json.dumps(status, sort_keys=True), now(), namespace, name))
            if labels is not None:
                conn.execute("UPDATE cloudvms SET labels = ? WHERE namespace = ? AND name = ?",
                             (json.dumps(labels, sort_keys=True), namespace, name))

    def delete_vm(self, namespace: str, name: str) -> None:
        """Delete the record and its allocation and lease (the volume and its claim stay)."""
        with self.transaction() as conn:
            row = conn.execute("SELECT uid FROM cloudvms WHERE namespace = ? AND name = ?",
                               (namespace, name)).fetchone()
            if row is None:
                return
            conn.execute("DELETE FROM allocations WHERE vm_uid = ?", (row["uid"],))
            conn.execute("DELETE FROM leases WHERE vm_uid = ?", (row["uid"],))
            conn.execute("DELETE FROM cloudvms WHERE uid = ?", (row["uid"],))

    # --- volumes ------------------------------------------------------------------------------
    def get_volume(self, name: str) -> Optional[dict]:
        """The volume record (name, driver, location, size_mib, owner, claimed_by, image)."""
        row = self.conn.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
        return dict(row) if row else None

    def list_volumes(self) -> list[dict]:
        """Every volume record, ordered by name."""
        return [dict(r) for r in self.conn.execute("SELECT * FROM volumes ORDER BY name").fetchall()]

    def put_volume(self, volume: dict) -> None:
        """Insert or replace a volume record (keys as in :meth:`get_volume`)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO volumes (name, driver, location, size_mib, owner, claimed_by, image,"
                " created_at) VALUES (:name, :driver, :location, :size_mib, :owner, :claimed_by, :image,"
                " :created_at)", {"claimed_by": None, "image": None, "created_at": now(), **volume})

    def delete_volume(self, name: str) -> None:
        """Forget a volume record."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM volumes WHERE name = ?", (name,))

    # --- allocations and leases ---------------------------------------------------------------
    def allocations(self, node: Optional[str] = None) -> list[dict]:
        """Resource allocations (vm_uid, node, vcpus, memory_mib, disk_mib, bandwidth_mbps)."""
        if node is None:
            rows = self.conn.execute("SELECT * FROM allocations").fetchall()
        else:
            rows = self.conn.execute("SELECT * FROM allocations WHERE node = ?", (node,)).fetchall()
        return [dict(r) for r in rows]

    def put_allocation(self, alloc: dict) -> None:
        """Insert or replace the allocation of ``alloc['vm_uid']``."""
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO allocations (vm_uid, node, vcpus, memory_mib, disk_mib,"
                         " bandwidth_mbps) VALUES (:vm_uid, :node, :vcpus, :memory_mib, :disk_mib,"
                         " :bandwidth_mbps)", alloc)

    def delete_allocation(self, vm_uid: str) -> None:
        """Forget the allocation of ``vm_uid`` (none is no error)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM allocations WHERE vm_uid = ?", (vm_uid,))

    def leases(self) -> list[dict]:
        """Every IPv4 lease (ipv4, vm_uid, mac, tap)."""
        return [dict(r) for r in self.conn.execute("SELECT * FROM leases ORDER BY ipv4").fetchall()]

    def lease_for(self, vm_uid: str) -> Optional[dict]:
        """The lease of one VM, or None."""
        row = self.conn.execute("SELECT * FROM leases WHERE vm_uid = ?", (vm_uid,)).fetchone()
        return dict(row) if row else None

    def put_lease(self, lease: dict) -> None:
        """Record a lease; raises :class:`StoreError` if the address or VM already has one."""
        try:
            with self.transaction() as conn:
                conn.execute("INSERT INTO leases (ipv4, vm_uid, mac, tap) VALUES (:ipv4, :vm_uid, :mac, :tap)",
                             lease)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"lease conflict for {lease}: {exc}") from exc


def as_json(value: Any) -> str:
    """Canonical JSON (sorted keys) used for comparisons and diffs."""
    return json.dumps(value, sort_keys=True)
