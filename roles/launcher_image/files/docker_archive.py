"""Write a one-layer docker-archive image (``docker save`` format) from a directory tree, stdlib only.

The archive is what ``ctr -n k8s.io images import`` (containerd), ``docker load`` and ``podman load`` accept,
so nodes without a registry can get an image from a file::

    python3 docker_archive.py --root ROOTFS --tag localhost/zjusct/launcher:0.1.0 \\
        --entrypoint '["python3","-m","zjusct_launcher"]' --out launcher.tar

Archive members (format: moby image/spec v1.2 "docker save" layout):

* ``<sha256 of config>.json`` - the image config: architecture amd64, os linux, ``config`` (Env, Entrypoint, Cmd,
  WorkingDir, Labels), ``rootfs.diff_ids`` = [sha256 of the uncompressed layer tar], one ``history`` entry.
* ``<sha256 of layer>/layer.tar`` - the uncompressed layer: every entry below ``root`` (names without ``./``),
  sorted, owners and modes kept, hard links kept as links, device nodes and sockets skipped (the runtime
  provides /dev), modification times clamped to ``mtime`` so equal trees give byte-identical archives.
* ``manifest.json`` - ``[{"Config": ..., "RepoTags": [tag], "Layers": [...]}]``.
* ``repositories`` - ``{name: {tag: layer-id}}`` (older loaders read it).

Errors: :class:`ValueError` for a bad tag or a missing root directory; ``OSError`` from the file system.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import stat
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

# name[:tag], name = lowercase path components, optionally a registry host (with port) first.
TAG_RE = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)
DEFAULT_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
CHUNK = 1 << 20


class _HashingWriter(io.RawIOBase):
    """A write-only file object that hashes (sha256) and counts what passes through to ``out``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.sha.update(b)
        self.size += len(b)
        self.out.write(b)
        return len(b)


def _sorted_walk(root: Path, overlays: tuple[Path, ...] = (), exclude: tuple[str, ...] = ()) -> list[tuple[str, Path]]:
    """``(name, path)`` of every entry below ``root`` and then ``overlays`` (a later tree's entry replaces an
    earlier one of the same name; directories merge), parents before children, minus ``exclude`` (names relative
    to ``/`` and everything below them)."""
    found: dict[str, Path] = {}

    def rec(prefix: str, directory: Path) -> None:
        for entry in os.scandir(directory):
            name = f"{prefix}{entry.name}"
            if name in exclude:
                continue
            found[name] = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                rec(f"{name}/", Path(entry.path))

    for tree in (root, *overlays):
        rec("", tree)
    return [(name, found[name]) for name in sorted(found, key=lambda n: n.split("/"))]


def write_layer(root: Path, out: BinaryIO, mtime: int = 0, overlays: tuple[Path, ...] = (),
                exclude: tuple[str, ...] = ()) -> tuple[str, int]:
    """Write the uncompressed layer tar of ``root`` (plus ``overlays``, minus ``exclude``) to ``out``.

    Args:
        root: the directory whose contents become the image's ``/``.
        overlays: further trees added on top of ``root`` (same-named files replace ``root``'s).
        exclude: entry names relative to ``/`` (e.g. ``usr/lib/python3/dist-packages/x``) left out with their
            contents.
        out: binary file object written sequentially.
        mtime: seconds since the epoch; later modification times are clamped to it (reproducible layers).

    Returns:
        ``("sha256:<hex>", size in bytes)`` of the layer tar (its diff_id).
    """
    hw = _HashingWriter(out)
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=hw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path in _sorted_walk(root, overlays, exclude):
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime = min(int(info.mtime), mtime) if mtime else int(info.mtime)
            info.uname = info.gname = ""
            if info.isreg() and st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in links:
                    info.type, info.linkname, info.size = tarfile.LNKTYPE, links[key], 0
                    tar.addfile(info)
                    continue
                links[key] = name
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return f"sha256:{hw.sha.hexdigest()}", hw.size


def image_config(diff_id: str, entrypoint: list[str] | None, cmd: list[str] | None, env: list[str],
                 labels: dict[str, str], workdir: str, created: str) -> dict[str, Any]:
    """The image config document (moby image spec v1.2) for one layer with ``diff_id``."""
    cfg: dict[str, Any] = {"Env": list(env), "WorkingDir": workdir, "Labels": dict(labels)}
    if entrypoint is not None:
        cfg["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        cfg["Cmd"] = list(cmd)
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "zjusct.cloud docker_archive.py"}],
    }


def write_archive(root: Path, tag: str | list[str], out: Path, *, entrypoint: list[str] | None = None,
                  cmd: list[str] | None = None, env: tuple[str, ...] | list[str] = DEFAULT_ENV,
                  labels: dict[str, str] | None = None, workdir: str = "/", mtime: int = 0,
                  overlays: tuple[Path, ...] = (), exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write ``out`` (docker-archive tar) holding one image tagged ``tag`` whose only layer is ``root``.

    ``tag`` may be a list: the image gets every tag (``RepoTags``), e.g. the version and a content-keyed tag.

    The archive is written to a temporary file next to ``out`` and renamed into place.

    Args:
        root: directory tree of the image's root file system.
        tag: ``name:tag``, e.g. ``localhost/zjusct/launcher:0.1.0`` (lowercase name, explicit tag), or a list.
        out: the archive path.
        entrypoint, cmd: the image's Entrypoint and Cmd (argv lists) or None.
        env: ``KEY=value`` strings (default: a standard PATH).
        labels: image labels.
        workdir: absolute working directory.
        mtime: clamp for entry modification times and the ``created`` stamp (0 = keep times, created = epoch).
        overlays, exclude: see :func:`write_layer`.

    Returns:
        ``{"tag", "tags", "config_digest", "diff_id", "layer_size", "size"}`` (``tag`` the first tag, digests as
        ``sha256:<hex>``, sizes in bytes).

    Raises:
        ValueError: ``tag`` is not ``name:tag``, ``root`` is not a directory or ``workdir`` is not absolute.
        OSError: reading ``root`` or writing ``out`` failed.
    """
    tags = [tag] if isinstance(tag, str) else list(tag)
    if not tags:
        raise ValueError("tag: at least one name:tag is required")
    for t in tags:
        if not TAG_RE.match(t):
            raise ValueError(f"tag {t!r} is not a lowercase image name with an explicit :tag (e.g. localhost/x:1.0)")
    for tree in (root, *overlays):
        if not tree.is_dir():
            raise ValueError(f"root {str(tree)!r} is not a directory")
    if not workdir.startswith("/"):
        raise ValueError(f"workdir {workdir!r} is not an absolute path")
    created = "1970-01-01T00:00:00Z"
    if mtime:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".docker-archive-") as tmp:
        layer_path = Path(tmp) / "layer.tar"
        with layer_path.open("wb") as f:
            diff_id, layer_size = write_layer(root, f, mtime, tuple(overlays), tuple(exclude))
        layer_hex = diff_id.split(":", 1)[1]
        config = image_config(diff_id, entrypoint, cmd, list(env), labels or {}, workdir, created)
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_hex = hashlib.sha256(config_bytes).hexdigest()
        manifest = [{"Config": f"{config_hex}.json", "RepoTags": tags, "Layers": [f"{layer_hex}/layer.tar"]}]
        repositories: dict[str, dict[str, str]] = {}
        for t in tags:
            name, version = t.rsplit(":", 1)
            repositories.setdefault(name, {})[version] = layer_hex
        members: list[tuple[str, bytes | Path]] = [
            (f"{layer_hex}/layer.tar", layer_path),
            (f"{config_hex}.json", config_bytes),
            ("manifest.json", json.dumps(manifest, separators=(",", ":")).encode()),
            ("repositories", json.dumps(repositories, separators=(",", ":")).encode()),
        ]
        partial = Path(tmp) / "image.tar"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            dir_info = tarfile.TarInfo(f"{layer_hex}")
            dir_info.type, dir_info.mode, dir_info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(dir_info)
            for member, data in members:
                info = tarfile.TarInfo(member)
                info.mode, info.mtime = 0o644, mtime
                if isinstance(data, Path):
                    info.size = data.stat().st_size
                    with data.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(partial, out)
    return {
        "tag": tags[0],
        "tags": tags,
        "config_digest": f"sha256:{config_hex}",
        "diff_id": diff_id,
        "layer_size": layer_size,
        "size": out.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: write one archive, print the result of :func:`write_archive` as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--root", required=True, type=Path, help="directory tree of the image's /")
    p.add_argument("--tag", required=True, action="append", help="name:tag, e.g. localhost/zjusct/launcher:0.1.0 "
                   "(repeatable: every tag names the image)")
    p.add_argument("--out", required=True, type=Path, help="archive file to write")
    p.add_argument("--entrypoint", type=json.loads, help="JSON argv list")
    p.add_argument("--cmd", type=json.loads, help="JSON argv list")
    p.add_argument("--env", action="append", help="KEY=value (repeatable; default: a standard PATH)")
    p.add_argument("--label", action="append", default=[], help="KEY=value (repeatable)")
    p.add_argument("--overlay", action="append", default=[], type=Path,
                   help="directory tree added on top of --root (repeatable; later wins)")
    p.add_argument("--exclude", action="append", default=[],
                   help="entry name relative to / left out with its contents (repeatable)")
    p.add_argument("--workdir", default="/")
    p.add_argument("--mtime", type=int, default=0, help="clamp entry times to this epoch second (0: keep)")
    a = p.parse_args(argv)
    labels = dict(item.split("=", 1) for item in a.label)
    try:
        info = write_archive(a.root, a.tag, a.out, entrypoint=a.entrypoint, cmd=a.cmd,
                             env=a.env or DEFAULT_ENV, labels=labels, workdir=a.workdir, mtime=a.mtime,
                             overlays=tuple(a.overlay), exclude=tuple(a.exclude))
    except ValueError as exc:
        print(f"docker_archive.py: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
