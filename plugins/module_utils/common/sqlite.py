# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SQLite write transactions and event rows, shared by the host store and the QoS state.

``BEGIN IMMEDIATE`` takes the database's write lock up front, so a read-modify-write sequence
inside the block can never lose an update to a concurrent writer; a concurrent writer waits up to
the connection's busy timeout (https://www.sqlite.org/lang_transaction.html).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from typing import Iterator, Optional


def now() -> str:
    """The current time as RFC 3339 UTC with seconds precision (``2026-11-30T07:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_precise() -> str:
    """The current time as RFC 3339 UTC with microseconds (``2026-11-30T07:00:00.123456Z``)."""
    stamp = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1e6):06d}Z"


def insert_event(conn: sqlite3.Connection, kind: str, subject: str, reason: str, message: str,
                 data: Optional[dict] = None) -> None:
    """Append one row to the host store's ``events`` table in its own write transaction (or the caller's).

    The table and the subject convention are the host store's (host.store.MIGRATIONS, docs/host-backend.md "Events").
    """
    with write_transaction(conn):
        conn.execute("INSERT INTO events (ts, kind, subject, reason, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                     (now(), kind, subject, reason, message, json.dumps(data or {}, sort_keys=True)))


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run a block in one write transaction, committed on success and rolled back on any error.

    The connection must be in autocommit mode (``isolation_level=None``). Nested use joins the
    outer transaction.
    """
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
