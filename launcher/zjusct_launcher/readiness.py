"""SSH readiness: the guest is ready when a TCP connection yields bytes starting with ``SSH-``.

A bare connect proves nothing: QEMU's user-mode network accepts connections on the forwarded port before the
guest's sshd runs (shared/recipes/guest.md). RFC 4253 section 4.2: the server sends its identification string
``SSH-protoversion-softwareversion`` first.
"""

from __future__ import annotations

import socket
import threading
import time

ATTEMPT_INTERVAL_SECONDS = 0.5
CONNECT_TIMEOUT_SECONDS = 2.0
BANNER_TIMEOUT_SECONDS = 5.0


def banner_once(host: str, port: int, connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                banner_timeout: float = BANNER_TIMEOUT_SECONDS) -> bytes | None:
    """One attempt: connect and read the first bytes. Returns them when they start with ``SSH-``, else None."""
    try:
        with socket.create_connection((host, port), timeout=connect_timeout) as sock:
            sock.settimeout(banner_timeout)
            data = b""
            deadline = time.monotonic() + banner_timeout
            while len(data) < 4 and time.monotonic() < deadline:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data if data.startswith(b"SSH-") else None
    except OSError:
        return None


def wait_for_banner(host: str, port: int, timeout_seconds: float, stop: threading.Event) -> bytes | None:
    """Retry :func:`banner_once` until it succeeds, ``timeout_seconds`` pass, or ``stop`` is set."""
    deadline = time.monotonic() + timeout_seconds
    while not stop.is_set() and time.monotonic() < deadline:
        banner = banner_once(host, port, banner_timeout=min(BANNER_TIMEOUT_SECONDS,
                                                            max(0.1, deadline - time.monotonic())))
        if banner is not None:
            return banner
        stop.wait(ATTEMPT_INTERVAL_SECONDS)
    return None
