"""Minimal QMP client over a unix socket (QEMU Machine Protocol, docs/interop/qmp-spec in QEMU).

Wire facts: the server greets with ``{"QMP": ...}``; a client must send ``qmp_capabilities`` first; every
message is one JSON object followed by CRLF/LF; replies are ``{"return": ...}`` or ``{"error": ...}``;
asynchronous ``{"event": NAME, "data": ...}`` may arrive at any time, including between a command and its reply.
Events the launcher uses: SHUTDOWN (data.reason: guest-shutdown, guest-reset, guest-panic, host-qmp-quit,
host-qmp-system-reset, host-signal, ...) and GUEST_PANICKED.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable


class QmpError(Exception):
    pass


class QmpClient:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = b""
        self.events: list[dict[str, Any]] = []
        self.closed = False

    @classmethod
    def connect(cls, path: str, timeout_seconds: float, alive: Callable[[], bool] = lambda: True) -> QmpClient:
        """Connect (retrying while the socket is not there yet and ``alive()``), negotiate capabilities.

        Raises QmpError when the deadline passes or the VMM died.
        """
        deadline = time.monotonic() + timeout_seconds
        last: Exception | None = None
        while time.monotonic() < deadline and alive():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
                sock.connect(path)
                client = cls(sock)
                greeting = client._read_message(deadline)
                if "QMP" not in greeting:
                    raise QmpError(f"unexpected QMP greeting: {greeting!r}")
                client.execute("qmp_capabilities", timeout_seconds=max(0.1, deadline - time.monotonic()))
                sock.setblocking(False)
                return client
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                last = exc
                time.sleep(0.05)
            except (OSError, QmpError, ValueError) as exc:
                sock.close()
                last = exc
                time.sleep(0.1)
        raise QmpError(f"cannot connect to QMP at {path}: {last or 'the VMM exited'}")

    def fileno(self) -> int:
        return self.sock.fileno()

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QmpError("QMP read timed out")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                self.closed = True
                raise QmpError("QMP connection closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        line = line.strip()
        if not line:
            return self._read_message(deadline)
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise QmpError(f"unexpected QMP message {msg!r}")
        return msg

    def execute(self, command: str, arguments: dict[str, Any] | None = None,
                timeout_seconds: float = 5.0) -> Any:
        """Send a command and return its ``return`` value; events seen meanwhile go to ``self.events``.

        Raises QmpError on an ``error`` reply, timeout or closed connection.
        """
        deadline = time.monotonic() + timeout_seconds
        req: dict[str, Any] = {"execute": command}
        if arguments:
            req["arguments"] = arguments
        self.sock.settimeout(timeout_seconds)
        try:
            self.sock.sendall(json.dumps(req).encode() + b"\n")
            while True:
                msg = self._read_message(deadline)
                if "event" in msg:
                    self.events.append(msg)
                elif "error" in msg:
                    raise QmpError(f"{command}: {msg['error'].get('desc', msg['error'])}")
                elif "return" in msg:
                    return msg["return"]
        except OSError as exc:
            raise QmpError(f"{command}: {exc}") from exc
        finally:
            if not self.closed:
                self.sock.setblocking(False)

    def poll_events(self) -> list[dict[str, Any]]:
        """Read what is available without blocking; return and clear the pending events."""
        if not self.closed:
            try:
                while True:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        self.closed = True
                        break
                    self._buf += chunk
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.closed = True
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.strip():
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(msg, dict) and "event" in msg:
                        self.events.append(msg)
        out, self.events = self.events, []
        return out

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
