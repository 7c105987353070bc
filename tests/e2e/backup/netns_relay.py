"""A TCP relay that makes the root namespace's 127.0.0.1 ports reachable as 127.0.0.1 inside a network namespace.

The host backend runs each launcher (and so QEMU/librbd) inside the cloud's network namespace, while the test Ceph
cluster (tests/ceph) listens on the root namespace's loopback and advertises 127.0.0.1 addresses in its maps. On a
real hypervisor the Ceph public network is reachable from that namespace through its uplink; here this relay
stands in for it, so the test's traffic stays on loopback. Listening sockets are created inside the namespace
(``setns(2)`` on the creating thread, then back), outgoing connections in the root namespace.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import socket
import threading

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _pump(a: socket.socket, b: socket.socket) -> None:
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class NetnsRelay:
    """Listen on 127.0.0.1:<port> in ``netns`` for each port, forward to 127.0.0.1:<port> in this namespace."""

    def __init__(self, netns: str, ports: list[int]) -> None:
        self.listeners: list[socket.socket] = []
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                for port in ports:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", port))
                    s.listen(64)
                    s.setblocking(False)
                    self.listeners.append(s)
            finally:
                _setns(own)
        finally:
            os.close(own)
            os.close(target)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        for s in self.listeners:
            sel.register(s, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.5):
                listener = key.fileobj
                assert isinstance(listener, socket.socket)
                try:
                    inner, _addr = listener.accept()
                except OSError:
                    continue
                inner.setblocking(True)
                port = listener.getsockname()[1]
                try:
                    outer = socket.create_connection(("127.0.0.1", port), timeout=10)
                    outer.settimeout(None)
                except OSError:
                    inner.close()
                    continue
                for a, b in ((inner, outer), (outer, inner)):
                    threading.Thread(target=_pump, args=(a, b), daemon=True).start()
        sel.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.listeners:
            s.close()
