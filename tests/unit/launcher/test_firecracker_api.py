"""Firecracker's API client (firecracker_api.py) against a small in-test server speaking the same HTTP/1.1 over a
unix socket."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from zjusct_launcher import firecracker_api


class FakeApi(threading.Thread):
    """Speaks HTTP/1.1 on a unix socket like Firecracker's API: 204 for SendCtrlAltDel, 400 otherwise."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.requests: list[tuple[str, dict[str, object]]] = []

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                             .split(b":")[1])
                while len(body) < length:
                    body += conn.recv(4096)
                payload = json.loads(body)
                self.requests.append((head.split(b"\r\n")[0].decode(), payload))
                if payload.get("action_type") == "SendCtrlAltDel":
                    conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                else:
                    msg = b'{"fault_message":"bad action"}'
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(msg), msg))


def test_send_ctrl_alt_del_puts_the_action(tmp_path: Path) -> None:
    api = FakeApi(str(tmp_path / "fc.sock"))
    api.start()
    firecracker_api.send_ctrl_alt_del(str(tmp_path / "fc.sock"))
    assert api.requests == [("PUT /actions HTTP/1.1", {"action_type": "SendCtrlAltDel"})]
    status, body = firecracker_api.api_request(str(tmp_path / "fc.sock"), "PUT", "/actions", {"action_type": "X"})
    assert status == 400 and b"bad action" in body
    api.sock.close()


def test_api_error_when_nothing_listens(tmp_path: Path) -> None:
    with pytest.raises(firecracker_api.ApiError, match="PUT /actions"):
        firecracker_api.send_ctrl_alt_del(str(tmp_path / "missing.sock"), timeout_seconds=1)
