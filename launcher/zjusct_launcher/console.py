"""Attach a terminal to a guest's serial console (``serialConsole`` socket), and the SSH gateway's shell.

The launcher's QEMU listens on ``serialConsole.socketPath`` (:func:`qemu.serial_chardev`) and serves one client at a
time; this module is that client (docs/tenants.md, "Serial console"; docs/security.md):

* :func:`attach` relays between a terminal and the socket: the terminal in raw mode (every key, Ctrl-C included,
  goes to the guest), the escape character :data:`ESCAPE` (Ctrl-]) detaches. One session per console: a second
  attachment is refused with a message while the first lasts (:func:`session_lock`), rather than hanging
  unanswered behind it in the socket's queue.
* :func:`gateway_main` is the login shell of the SSH gateway's accounts (``zc-<owner>``; network.gateway). sshd runs
  it as ``<shell> -c "<the key's forced command>"``; the forced command the cloud writes for each key lists the
  consoles that key may open (``<namespace>/<name>=<socket path>`` words, the VMs whose keys list it) and the
  tenant's own command (``SSH_ORIGINAL_COMMAND``) picks one: ``console [<name> | <namespace>/<name>]``. Nothing
  else runs: no shell, no other command, no path the tenant types.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import select
import socket
import sys
import termios
import tty
from typing import IO

ESCAPE = b"\x1d"
"""The byte that ends a session (Ctrl-], as telnet and ``virsh console`` have it)."""
ESCAPE_NAME = "Ctrl-]"
GRANT_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)/([a-z0-9]([-a-z0-9]*[a-z0-9])?)=(/[A-Za-z0-9_./-]+)$")
"""One word of a gateway key's forced command: ``<namespace>/<name>=<socket path>``."""
BUFFER = 65536


class ConsoleError(Exception):
    """No session: the message says why (for the user's terminal); ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def lock_name(socket_path: str) -> bytes:
    """The abstract unix socket name (unix(7)) that marks a session on ``socket_path``."""
    return b"\0zjusct-console/" + hashlib.sha256(socket_path.encode()).hexdigest()[:32].encode()


def session_lock(socket_path: str, label: str) -> socket.socket:
    """Hold the one session of ``socket_path``'s console (until the returned socket is closed or the process ends).

    An abstract socket bound in the caller's network namespace: the kernel releases it when its holder exits,
    however it exits. Sessions started in one namespace (the SSH gateway's; a launcher Pod's) exclude each other; a
    session from another namespace (root's ``zjusct-launcher console`` in another one) is not excluded and waits in
    QEMU's queue until the first ends. Abstract names have no permissions: a process of the namespace that binds
    the name first (none of a tenant's: the gateway runs only this client) makes the console look busy.

    Raises:
        ConsoleError: another session holds it.
    """
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        holder.bind(lock_name(socket_path))
    except OSError as exc:
        holder.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConsoleError(f"the console of {label} is in use by another session (one at a time); "
                               f"that session detaches with {ESCAPE_NAME}") from None
        raise ConsoleError(f"cannot mark the session on the console of {label}: {exc.strerror}") from None
    return holder


def connect(socket_path: str, label: str) -> socket.socket:
    """Connect to the console socket of ``label`` (``<namespace>/<name>``).

    Raises:
        ConsoleError: the VM does not run (no socket, nobody listening) or the caller may not open it.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(socket_path)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            raise ConsoleError(f"{label} is not running: its console exists only while a boot runs "
                               "(start it with vm_start.yml)") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ConsoleError(f"you may not open the console of {label}") from None
        raise ConsoleError(f"cannot open the console of {label}: {exc.strerror}") from None
    return sock


def relay(sock: socket.socket, in_fd: int, out_fd: int) -> str:
    """Copy bytes both ways until the user types :data:`ESCAPE`, the input ends or the VMM closes the console.

    Returns:
        ``"detached"``, ``"input closed"``, ``"output closed"`` or ``"console closed"`` (also when the VMM reset the
        connection).
    """
    sock_fd = sock.fileno()
    while True:
        readable = select.select([in_fd, sock_fd], [], [])[0]
        if sock_fd in readable:
            try:
                data = sock.recv(BUFFER)
            except OSError:  # reset by the VMM as it ends
                data = b""
            if not data:
                return "console closed"
            try:
                _write_all(out_fd, data)
            except OSError:  # the terminal hung up
                return "output closed"
        if in_fd in readable:
            try:
                data = os.read(in_fd, BUFFER)
            except OSError:  # EIO: the terminal hung up
                data = b""
            if not data:
                return "input closed"
            cut = data.find(ESCAPE)
            try:
                if cut >= 0:
                    if cut:
                        sock.sendall(data[:cut])
                    return "detached"
                sock.sendall(data)
            except OSError:
                return "console closed"


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def attach(socket_path: str, label: str, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
           stderr: IO[str] | None = None) -> int:
    """One console session on ``socket_path`` for the terminal (or pipe) on ``stdin``/``stdout``.

    Messages (the banner, why the session ended) go to ``stderr``; while a terminal is raw its lines end in CR LF.

    Returns:
        the exit status: 0 after a session (detached, input or console closed), else :class:`ConsoleError`'s.
    """
    in_fd = (stdin or sys.stdin.buffer).fileno()
    out_fd = (stdout or sys.stdout.buffer).fileno()
    err = stderr or sys.stderr
    try:
        holder = session_lock(socket_path, label)
        try:
            sock = connect(socket_path, label)
        except ConsoleError:
            holder.close()
            raise
    except ConsoleError as exc:
        err.write(f"zjusct console: {exc}\n")
        err.flush()
        return exc.status
    saved = termios.tcgetattr(in_fd) if os.isatty(in_fd) else None
    eol = "\r\n" if saved is not None else "\n"
    try:
        err.write(f"zjusct console: connected to {label}; detach with {ESCAPE_NAME}"
                  + ("" if saved is not None else " (no terminal: ssh -t gives one)") + "; press Enter for a prompt\n")
        err.flush()
        if saved is not None:
            tty.setraw(in_fd, termios.TCSADRAIN)
        why = relay(sock, in_fd, out_fd)
    finally:
        if saved is not None:
            try:
                termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
            except termios.error:  # the terminal is gone
                pass
        sock.close()
        holder.close()
    err.write(f"{eol}zjusct console: {why} ({label}){eol}")
    err.flush()
    return 0


def parse_grants(command: str) -> dict[str, str]:
    """The consoles a gateway key's forced command grants: ``<namespace>/<name>`` -> socket path.

    Raises:
        ConsoleError: a word is not ``<namespace>/<name>=<socket path>`` (the gateway's files are not the
            cloud's: nothing is opened).
    """
    grants = {}
    for word in command.split():
        match = GRANT_RE.match(word)
        if match is None:
            raise ConsoleError("this gateway account's forced command is not one the cloud wrote; ask the operator",
                               status=2)
        grants[f"{match.group(1)}/{match.group(3)}"] = match.group(5)
    return grants


def choose(grants: dict[str, str], request: str | None) -> tuple[str, str]:
    """Which console the tenant's command asks for: ``console``, ``console <name>`` or ``console <ns>/<name>``.

    Returns:
        ``(label, socket path)``.

    Raises:
        ConsoleError: status 2 for anything else, a VM not granted or a name that is not unique; the message
            names the VMs this key opens.
    """
    mine = ", ".join(sorted(grants)) or "none"
    usage = (f"this is the zjusct.cloud SSH gateway: ssh -J <account>@<gateway> to reach your VMs' SSH, or "
             f"ssh -t <account>@<gateway> console <vm> for a VM's serial console (this key opens: {mine})")
    words = (request or "").split()
    if not words or words[0] != "console" or len(words) > 2:
        raise ConsoleError(usage, status=2)
    if len(words) == 1:
        if len(grants) == 1:
            return next(iter(grants.items()))
        raise ConsoleError(f"name the VM: console <vm> (this key opens: {mine})", status=2)
    wanted = words[1]
    if wanted in grants:
        return wanted, grants[wanted]
    same_name = [label for label in grants if label.split("/", 1)[1] == wanted]
    if len(same_name) == 1:
        return same_name[0], grants[same_name[0]]
    if same_name:
        raise ConsoleError(f"{wanted} names {len(same_name)} VMs: console <namespace>/{wanted} "
                           f"(this key opens: {mine})", status=2)
    raise ConsoleError(f"no console of {wanted!r} for this key: a key opens the consoles of its owner's VMs whose "
                       f"keys list it (this key opens: {mine})", status=2)


def gateway_main(argv: list[str]) -> int:
    """The SSH gateway account's shell: ``-c <forced command>`` from sshd, the tenant's ``SSH_ORIGINAL_COMMAND``.

    Returns:
        the exit status (2 for a usage error, 1 when the console cannot be opened).
    """
    try:
        if len(argv) != 2 or argv[0] != "-c":
            raise ConsoleError("this account has no shell: ssh -t <account>@<gateway> console <vm>", status=2)
        label, path = choose(parse_grants(argv[1]), os.environ.get("SSH_ORIGINAL_COMMAND"))
    except ConsoleError as exc:
        sys.stderr.write(f"zjusct gateway: {exc}\n")
        return exc.status
    return attach(path, label)
