# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SQLite write transactions shared by the host store and the QoS state.

``BEGIN IMMEDIATE`` takes the database's write lock up front, so a read-modify-write sequence
inside the block can never lose an update to a concurrent writer; a concurrent writer waits up to
the connection's busy timeout (https://www.sqlite.org/lang_transaction.html).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Iterator


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
