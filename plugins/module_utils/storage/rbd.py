# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Thin adapter over the ``rbd`` command-line tool (Ceph RBD images, snapshots, image-meta, export/import).

Every call is an argument list (never a shell string), runs with ``LC_ALL=C`` and a timeout, asks for
``--format json`` where the subcommand has it, and turns failures into ``RbdError`` subclasses carrying the
errno that ``rbd`` printed (``(2) No such file or directory`` -> ``RbdNotFound``; ``(16)`` -> ``RbdBusy``).

Credentials: the connection names a keyring *path*; an optional secret ``key`` is written to a private
temporary file passed as ``--keyfile`` (never on the command line, where ``ps`` would show it) and removed
after the call. Neither keyring contents nor the key appear in exceptions, return values or logs: stderr is
scrubbed of the key before it is quoted.

Runs on the managed node's Python: standard library only.
Source of the CLI behaviour: ``rbd(8)`` (Ceph 16 pacific) and measurements in shared/recipes/ceph.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import CLAIMED_BY_MARK, OWNER_MARK

DEFAULT_TIMEOUT = 120.0
MiB = 1024 * 1024
META_OWNER = OWNER_MARK  # image-meta keys of the ownership marks
META_CLAIMED_BY = CLAIMED_BY_MARK
_ERRNO_RE = re.compile(r"\((\d+)\) ([A-Za-z][^\n]*)")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+][A-Za-z0-9_.+=:-]{0,249}$")


class RbdError(CloudError):
    """An ``rbd`` call failed. ``errno`` is the error number rbd printed (0 if none), ``command`` the
    subcommand words (no secrets), ``stderr`` the scrubbed tail of its error output."""

    def __init__(self, message: str, command: str = "", errno: int = 0, stderr: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.errno = errno
        self.stderr = stderr


class RbdNotFound(RbdError):
    """ENOENT: pool, image, snapshot or metadata key does not exist."""


class RbdBusy(RbdError):
    """EBUSY: the image has watchers, a protected snapshot has children, or similar."""


class RbdTimeout(RbdError):
    """The call did not finish within its timeout and was killed."""


class RbdMissing(RbdError):
    """The ``rbd`` executable is not installed."""


def check_name(field_name: str, value: str) -> str:
    """Validate a pool, image or snapshot name; raise ValueError naming the field and the value.

    Rule: 1-250 characters of letters, digits and ``_ . + - = :`` not starting with ``-`` (so a name can never be
    read as an option); ``/`` and ``@`` are separators in image specs and therefore refused.
    """
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(f"{field_name}: {value!r} is not a valid name (1-250 of A-Z a-z 0-9 _ . + - = :, "
                         "not starting with '-', no '/' or '@')")
    return value


def parse_image_spec(field_name: str, spec: str, default_pool: str = "rbd") -> "ImageRef":
    """Parse ``[pool/]image[@snap]`` into an ImageRef; raise ValueError naming the field when malformed."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{field_name}: {spec!r} is not an image spec ([pool/]image[@snapshot])")
    rest, _unused, snap = spec.partition("@")
    pool, sep, image = rest.partition("/")
    if not sep:
        pool, image = default_pool, rest
    try:
        ref = ImageRef(check_name(field_name + " (pool)", pool), check_name(field_name + " (image)", image),
                       check_name(field_name + " (snapshot)", snap) if snap else None)
    except ValueError as exc:
        raise ValueError(f"{exc}; expected [pool/]image[@snapshot], got {spec!r}") from None
    return ref


@dataclass(frozen=True)
class ImageRef:
    """An image (or one of its snapshots) in a pool."""

    pool: str
    image: str
    snapshot: Optional[str] = None

    @property
    def spec(self) -> str:
        """``pool/image`` or ``pool/image@snap`` as the rbd CLI takes it."""
        base = f"{self.pool}/{self.image}"
        return f"{base}@{self.snapshot}" if self.snapshot else base

    def at(self, snapshot: Optional[str]) -> "ImageRef":
        """The same image at another snapshot (None = the head)."""
        return ImageRef(self.pool, self.image, snapshot)


@dataclass
class Connection:
    """How to reach the cluster. Fields map to ceph common options: ``-c conf``, ``--cluster``, ``--id``,
    ``--keyring``, and (for ``key``) ``--keyfile`` on a private temporary file. ``timeout`` is seconds per call.
    """

    conf: Optional[str] = None
    cluster: Optional[str] = None
    user: Optional[str] = None
    keyring: Optional[str] = None
    key: Optional[str] = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    binary: str = "rbd"

    @classmethod
    def from_params(cls, params: Dict[str, Any]) -> "Connection":
        """Build from module parameters ``ceph_conf``, ``ceph_cluster``, ``ceph_user``, ``ceph_keyring``,
        ``ceph_key``, ``timeout`` (all optional)."""
        return cls(conf=params.get("ceph_conf") or None, cluster=params.get("ceph_cluster") or None,
                   user=params.get("ceph_user") or None, keyring=params.get("ceph_keyring") or None,
                   key=params.get("ceph_key") or None, timeout=float(params.get("timeout") or DEFAULT_TIMEOUT))


def connection_argument_spec() -> Dict[str, Any]:
    """The connection options shared by the RBD modules (documented in doc fragment ``zjusct.cloud.ceph``)."""
    from ansible.module_utils.basic import env_fallback  # only needed inside modules

    return dict(
        ceph_conf=dict(type="path", fallback=(env_fallback, ["CEPH_CONF"])),
        ceph_cluster=dict(type="str", fallback=(env_fallback, ["CEPH_CLUSTER"])),
        ceph_user=dict(type="str", aliases=["ceph_id"], fallback=(env_fallback, ["CEPH_USER"])),
        ceph_keyring=dict(type="path", fallback=(env_fallback, ["CEPH_KEYRING"]), no_log=False),
        ceph_key=dict(type="str", no_log=True, fallback=(env_fallback, ["CEPH_KEY"])),
        timeout=dict(type="float", default=DEFAULT_TIMEOUT),
    )


class Rbd:
    """Runs ``rbd`` subcommands for one connection. Methods return parsed JSON (dicts/lists) or None.

    All methods raise ``RbdError`` (or a subclass) on failure; ``timeout`` overrides the connection's for
    long transfers.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- plumbing ---------------------------------------------------------------------------------------

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        return env

    def _conn_args(self, keyfile: Optional[str]) -> List[str]:
        c = self.conn
        args: List[str] = []
        if c.conf:
            args += ["--conf", c.conf]
        if c.cluster:
            args += ["--cluster", c.cluster]
        if c.user:
            args += ["--id", c.user]
        if c.keyring:
            args += ["--keyring", c.keyring]
        if keyfile:
            args += ["--keyfile", keyfile]
        return args

    def _scrub(self, text: str) -> str:
        if self.conn.key:
            text = text.replace(self.conn.key, "********")
        return text

    def _keyfile(self) -> Optional[str]:
        if not self.conn.key:
            return None
        fd, path = tempfile.mkstemp(prefix="zjusct-rbd-key-")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, self.conn.key.encode())
        finally:
            os.close(fd)
        return path

    def _error(self, words: List[str], rc: int, stderr: str) -> RbdError:
        stderr = self._scrub(stderr).strip()
        found = _ERRNO_RE.findall(stderr)
        errno = int(found[-1][0]) if found else 0
        lines = [ln for ln in stderr.splitlines() if ln.strip() and " -1 " not in ln[:40]]
        detail = lines[-1] if lines else stderr[-300:]
        if "still has watchers" in stderr:
            errno = 16
            detail = "image still has watchers"
        cmd = " ".join(words)
        msg = f"rbd {cmd}: {detail} (exit {rc})"
        cls = RbdNotFound if errno == 2 else RbdBusy if errno == 16 else RbdError
        return cls(msg, command=cmd, errno=errno, stderr=stderr[-2000:])

    def run(self, words: List[str], json_out: bool = True, timeout: Optional[float] = None,
            stdin: Optional[bytes] = None) -> Any:
        """Run ``rbd <connection options> <words> [--format json]``; return parsed JSON (or stdout text).

        Raises: RbdMissing, RbdTimeout, RbdNotFound, RbdBusy, RbdError.
        """
        keyfile = self._keyfile()
        try:
            argv = [self.conn.binary, *self._conn_args(keyfile), *words]
            if json_out:
                argv += ["--format", "json"]
            t = timeout if timeout is not None else self.conn.timeout
            try:
                proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=t, env=self._env(),
                                      check=False)
            except FileNotFoundError as exc:
                raise RbdMissing(f"rbd executable {self.conn.binary!r} not found: install ceph-common",
                                 command=words[0]) from exc
            except subprocess.TimeoutExpired as exc:
                raise RbdTimeout(f"rbd {' '.join(words)}: no answer within {t:.0f} s (timeout)",
                                 command=" ".join(words)) from exc
        finally:
            if keyfile:
                os.unlink(keyfile)
        if proc.returncode != 0:
            raise self._error(words, proc.returncode, proc.stderr.decode(errors="replace"))
        out = proc.stdout.decode(errors="replace")
        if not json_out:
            return out
        if not out.strip():
            return None
        try:
            return json.loads(out)
        except ValueError as exc:
            raise RbdError(f"rbd {' '.join(words)}: unparsable JSON output: {out[:200]!r}",
                           command=" ".join(words)) from exc

    def popen(self, words: List[str], stdin: Any = None, stdout: Any = None) -> "RbdProcess":
        """Start a long-running ``rbd`` (export/import streams); the caller drives stdin/stdout and must call
        ``RbdProcess.finish`` (which enforces the timeout and raises on failure)."""
        keyfile = self._keyfile()
        argv = [self.conn.binary, *self._conn_args(keyfile), *words]
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, env=self._env())
        except FileNotFoundError as exc:
            if keyfile:
                os.unlink(keyfile)
            raise RbdMissing(f"rbd executable {self.conn.binary!r} not found: install ceph-common",
                             command=words[0]) from exc
        for pipe in (proc.stdout, proc.stdin):
            if pipe is not None:
                try:  # fewer wake-ups per MiB on Linux (F_SETPIPE_SZ); harmless if refused
                    import fcntl

                    fcntl.fcntl(pipe.fileno(), 1031, 1024 * 1024)
                except (OSError, ImportError, AttributeError):
                    pass
        return RbdProcess(self, words, proc, keyfile)

    # -- queries ----------------------------------------------------------------------------------------

    def info(self, ref: ImageRef) -> Optional[Dict[str, Any]]:
        """``rbd info`` as a dict, or None when the image (or snapshot) does not exist."""
        try:
            return self.run(["info", ref.spec])
        except RbdNotFound:
            return None

    def status(self, ref: ImageRef) -> List[Dict[str, Any]]:
        """Watchers of the image: list of {address, client, cookie}."""
        out = self.run(["status", ref.spec]) or {}
        return list(out.get("watchers", []))

    def snapshots(self, ref: ImageRef) -> List[Dict[str, Any]]:
        """Snapshots: list of {id, name, size (bytes), protected ("true"/"false"), timestamp}."""
        return list(self.run(["snap", "ls", ref.spec]) or [])

    def locks(self, ref: ImageRef) -> List[Dict[str, Any]]:
        """Advisory/exclusive locks: list of {id, locker, address}."""
        out = self.run(["lock", "ls", ref.spec]) or []
        if isinstance(out, dict):  # some releases print {"id": {...}}
            return [dict(v, id=k) for k, v in out.items()]
        return list(out)

    def meta(self, ref: ImageRef) -> Dict[str, str]:
        """All image-meta key/values (empty dict when none)."""
        return dict(self.run(["image-meta", "list", ref.spec]) or {})

    def children(self, ref: ImageRef, include_trash: bool = False) -> List[Dict[str, Any]]:
        """Clones of a snapshot (or, for an image spec, of all its snapshots): list of {pool, pool_namespace,
        image}; with ``include_trash`` (``--all``) also clones moved to the trash, each then carrying ``id`` and
        ``trash`` (bool). A trashed clone still holds its parent snapshot (unprotect fails with EBUSY)."""
        words = ["children", ref.spec] + (["--all"] if include_trash else [])
        return list(self.run(words) or [])

    def pool_exists(self, pool: str) -> bool:
        """Whether the pool exists (``rbd ls`` answers ENOENT for a missing pool)."""
        try:
            self.run(["ls", pool])
        except RbdNotFound:
            return False
        return True

    def ls(self, pool: str) -> List[str]:
        """Image names in a pool."""
        return list(self.run(["ls", pool]) or [])

    # -- changes ----------------------------------------------------------------------------------------

    def create(self, ref: ImageRef, size_mib: Optional[int] = None, features: Optional[List[str]] = None,
               size_bytes: Optional[int] = None) -> None:
        """Create an image of ``size_mib`` MiB (or exactly ``size_bytes`` bytes), format 2."""
        size = f"{int(size_bytes)}B" if size_bytes is not None else f"{int(size_mib or 0)}M"
        words = ["create", ref.spec, "--size", size]
        for f in features or []:
            words += ["--image-feature", f]
        self.run(words, json_out=False)

    def clone(self, parent: ImageRef, child: ImageRef) -> None:
        """Clone ``parent`` (must name a protected snapshot) into ``child``."""
        self.run(["clone", parent.spec, child.spec], json_out=False)

    def resize(self, ref: ImageRef, size_mib: int, allow_shrink: bool = False) -> None:
        """Set the image size to ``size_mib`` MiB; shrinking needs ``allow_shrink``."""
        words = ["resize", ref.spec, "--size", f"{int(size_mib)}M", "--no-progress"]
        if allow_shrink:
            words.append("--allow-shrink")
        self.run(words, json_out=False)

    def remove(self, ref: ImageRef) -> None:
        """Remove the image (fails with RbdBusy while it has watchers, RbdError while snapshots remain)."""
        self.run(["rm", ref.spec, "--no-progress"], json_out=False)

    def snap_create(self, ref: ImageRef) -> None:
        self.run(["snap", "create", ref.spec, "--no-progress"], json_out=False)

    def snap_remove(self, ref: ImageRef) -> None:
        self.run(["snap", "rm", ref.spec, "--no-progress"], json_out=False)

    def snap_protect(self, ref: ImageRef) -> None:
        self.run(["snap", "protect", ref.spec], json_out=False)

    def snap_unprotect(self, ref: ImageRef) -> None:
        self.run(["snap", "unprotect", ref.spec], json_out=False)

    def snap_purge(self, ref: ImageRef) -> None:
        """Remove every unprotected snapshot of the image."""
        self.run(["snap", "purge", ref.spec, "--no-progress"], json_out=False)

    def meta_set(self, ref: ImageRef, key: str, value: str) -> None:
        self.run(["image-meta", "set", ref.spec, key, value], json_out=False)

    def meta_remove(self, ref: ImageRef, key: str) -> None:
        self.run(["image-meta", "remove", ref.spec, key], json_out=False)

    def export(self, ref: ImageRef, path: str, timeout: Optional[float] = None) -> None:
        """Full raw export of the image (or snapshot) to a file (``-`` is not allowed here: use popen)."""
        self.run(["export", ref.spec, path, "--no-progress"], json_out=False, timeout=timeout)

    def export_diff(self, ref: ImageRef, path: str, from_snapshot: Optional[str] = None,
                    whole_object: bool = False, timeout: Optional[float] = None) -> None:
        """``rbd export-diff`` of ``ref`` (which should name a snapshot) since ``from_snapshot`` (None = from
        the beginning) into a file."""
        words = ["export-diff", ref.spec, path, "--no-progress"]
        if from_snapshot:
            words += ["--from-snap", from_snapshot]
        if whole_object:
            words.append("--whole-object")
        self.run(words, json_out=False, timeout=timeout)

    def import_raw(self, path: str, ref: ImageRef, timeout: Optional[float] = None) -> None:
        """Import a raw image file as a new image."""
        self.run(["import", path, ref.spec, "--no-progress"], json_out=False, timeout=timeout)

    def import_diff(self, path: str, ref: ImageRef, timeout: Optional[float] = None) -> None:
        """Apply an ``rbd diff v1`` stream to an existing image (creates the stream's end snapshot)."""
        self.run(["import-diff", path, ref.spec, "--no-progress"], json_out=False, timeout=timeout)


class RbdProcess:
    """A running streaming ``rbd`` call (see ``Rbd.popen``)."""

    def __init__(self, rbd: Rbd, words: List[str], proc: "subprocess.Popen[bytes]", keyfile: Optional[str]):
        self.rbd = rbd
        self.words = words
        self.proc = proc
        self._keyfile = keyfile

    @property
    def stdout(self) -> Any:
        return self.proc.stdout

    @property
    def stdin(self) -> Any:
        return self.proc.stdin

    def kill(self) -> None:
        """Kill the process (used when the consumer fails); never raises."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.finish(timeout=10, check=False)

    def finish(self, timeout: Optional[float] = None, check: bool = True) -> None:
        """Wait for exit (after the caller has drained/closed its pipes); raise RbdError on failure."""
        t = timeout if timeout is not None else self.rbd.conn.timeout
        try:
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()  # EOF for the child
                except OSError:  # child already gone (broken pipe): its exit status tells why
                    pass
                self.proc.stdin = None  # communicate() must not flush a closed pipe
            if self.proc.stdout is not None and not self.proc.stdout.closed:
                self.proc.stdout.close()
            try:
                _unused, err = self.proc.communicate(timeout=t)
            except subprocess.TimeoutExpired as exc:
                self.proc.kill()
                self.proc.communicate()
                if check:
                    raise RbdTimeout(f"rbd {' '.join(self.words)}: no exit within {t:.0f} s (timeout)",
                                     command=" ".join(self.words)) from exc
                return
        finally:
            if self._keyfile:
                try:
                    os.unlink(self._keyfile)
                except OSError:
                    pass
                self._keyfile = None
        if check and self.proc.returncode != 0:
            raise self.rbd._error(self.words, self.proc.returncode, (err or b"").decode(errors="replace"))
