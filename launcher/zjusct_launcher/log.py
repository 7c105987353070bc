"""JSON-lines logging on stderr.

Every line is one JSON object: ``{"ts": RFC3339, "level": ..., "msg": ..., <fields>}``. Callers pass only
non-secret fields; the launcher never logs keyring contents or key material (docs/launcher-protocol.md).
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import datetime, timezone
from typing import Any

_lock = threading.Lock()


def rfc3339(ts: float | None = None) -> str:
    """Format a UNIX time (seconds, default now) as RFC 3339 UTC with milliseconds."""
    moment = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log(level: str, msg: str, **fields: Any) -> None:
    """Write one JSON line: level is ``debug|info|warning|error``."""
    record = {"ts": rfc3339(), "level": level, "msg": msg}
    record.update(fields)
    line = json.dumps(record, default=str, sort_keys=False)
    with _lock:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def info(msg: str, **fields: Any) -> None:
    log("info", msg, **fields)


def warning(msg: str, **fields: Any) -> None:
    log("warning", msg, **fields)


def error(msg: str, **fields: Any) -> None:
    log("error", msg, **fields)
