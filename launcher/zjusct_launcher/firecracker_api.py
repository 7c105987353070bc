"""Firecracker's API: a tiny HTTP/1.1-over-unix-socket client (``Connection: close``, one request per connection).

Facts from Firecracker's API specification (firecracker.yaml) and docs (api_requests/actions.md): ``PUT /actions
{"action_type": "SendCtrlAltDel"}`` answers 204 No Content; Firecracker binds its API socket, then listens, shortly
after its start, so a request in between is refused (:class:`ApiNotListening`: retry).
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any


class ApiError(Exception):
    """A request to the API failed (the message names the method and path)."""


class ApiNotListening(ApiError):
    """The API socket is not there or not yet listening (the VMM binds it, then listens, shortly after its start):
    a request may be retried."""


def api_request(socket_path: str, method: str, path: str, body: dict[str, Any] | None = None,
                timeout_seconds: float = 5.0) -> tuple[int, bytes]:
    """One HTTP/1.1 request over the API unix socket (``Connection: close``). Returns (status, body).

    Raises ApiNotListening when the socket cannot be connected to yet (missing, or bound but not listening), and
    ApiError for any other failure (timeout in seconds, reset, malformed response).
    """
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout_seconds)
            try:
                sock.connect(socket_path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise ApiNotListening(f"{method} {path}: {exc}") from exc
            sock.sendall(head.encode() + payload)
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    header, _unused, rest = data.partition(b"\r\n\r\n")
                    match = re.search(rb"(?im)^content-length:\s*(\d+)", header)
                    if match is None or len(rest) >= int(match.group(1)):
                        break
    except OSError as exc:
        raise ApiError(f"{method} {path}: {exc}") from exc
    status_line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ApiError(f"{method} {path}: malformed response {status_line!r}")
    return int(parts[1]), data.partition(b"\r\n\r\n")[2]


def send_ctrl_alt_del(socket_path: str, timeout_seconds: float = 5.0) -> None:
    """``PUT /actions {"action_type": "SendCtrlAltDel"}``; Firecracker answers 204 (docs/api_requests/actions.md).

    Raises ApiNotListening (retry) or ApiError, as api_request, and ApiError on any other status.
    """
    status, body = api_request(socket_path, "PUT", "/actions", {"action_type": "SendCtrlAltDel"},
                               timeout_seconds)
    if status != 204:
        raise ApiError(f"SendCtrlAltDel: HTTP {status}: {body.decode(errors='replace')[:200]}")
