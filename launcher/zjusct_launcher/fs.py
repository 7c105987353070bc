"""The launcher's file writes: :func:`write_atomic` (pid files, the ready marker, configs) and :func:`publish`
(the result and the termination message).

The result is written with write-to-temp + fsync + rename + fsync(dir) (rename(2) is atomic within a
filesystem), so a reader sees either no file or a complete document.
"""

from __future__ import annotations

import os

from zjusct_launcher.result import Result, encode, encode_termination_message


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
        compact = encode_termination_message(result)
        try:
            # In place, not rename: in a Pod the path is a bind-mounted file and rename(2) onto it fails.
            with open(termination_message_path, "wb") as fh:
                fh.write(compact)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            errors.append(f"result.terminationMessagePath {termination_message_path}: {exc}")
    return errors
