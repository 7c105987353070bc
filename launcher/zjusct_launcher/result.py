"""LauncherResult v1: reasons, exit codes and the atomic result write.

The result is the only thing a supervisor needs to tell "ended with a result" from "vanished": it is written
with write-to-temp + fsync + rename + fsync(dir) (rename(2) is atomic within a filesystem), so a reader sees
either no file or a complete document.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from zjusct_launcher import API_VERSION

KIND = "LauncherResult"

# reason -> process exit code (notes/CONTRACT-guest.md: 0 = ended as asked or the guest shut down).
EXIT_CODES = {
    "GuestShutdown": 0,
    "GuestReboot": 0,
    "StopRequested": 0,
    "StopTimeoutKilled": 1,
    "HypervisorCrashed": 1,
    "GuestPanic": 1,
    "ReadinessTimeout": 1,
    "HypervisorMissing": 1,
    "LauncherError": 1,
    "ConfigInvalid": 2,
}
REASONS = tuple(EXIT_CODES)
EXIT_ALREADY_RUNNING = 3


@dataclass
class Result:
    vm: dict[str, Any]
    boot_id: int
    reason: str
    started_at: str
    finished_at: str
    message: str
    hypervisor_exit_status: int | None = None
    ready_at: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def as_json(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "vm": self.vm,
            "bootID": self.boot_id,
            "reason": self.reason,
            "exitCode": self.exit_code,
            "hypervisorExitStatus": self.hypervisor_exit_status,
            "startedAt": self.started_at,
            "readyAt": self.ready_at,
            "finishedAt": self.finished_at,
            "message": self.message,
        }


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, rename, fsync dir.

    Creates missing parent directories (0755). Raises OSError on failure (the temp file is removed).
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def encode(result: Result) -> bytes:
    return (json.dumps(result.as_json(), indent=2, sort_keys=False) + "\n").encode()


def publish(result: Result, path: str | None, termination_message_path: str | None) -> list[str]:
    """Write the result to its path and to the termination-message path (Pods). Returns errors (strings).

    The termination message is written in place (Kubernetes reads it after the container exits; it is limited
    to 4096 bytes, so the compact encoding is used there).
    """
    errors: list[str] = []
    if path:
        try:
            write_atomic(path, encode(result))
        except OSError as exc:
            errors.append(f"result.path {path}: {exc}")
    if termination_message_path:
        compact = json.dumps(result.as_json(), separators=(",", ":")).encode()[:4096]
        try:
            # In place, not rename: in a Pod the path is a bind-mounted file and rename(2) onto it fails.
            with open(termination_message_path, "wb") as fh:
                fh.write(compact)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            errors.append(f"result.terminationMessagePath {termination_message_path}: {exc}")
    return errors
