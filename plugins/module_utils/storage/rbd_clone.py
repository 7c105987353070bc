# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's ``rbd`` volume driver: root volumes as Ceph RBD clones of a per-image-set template.

With ``volume_driver: rbd`` in the host config (:mod:`host.config`), a new root volume is made in two steps:

1. The image set's ``rootfs.raw`` is imported once into the pool as ``tmpl-<image-set-dir-name>`` with a
   protected snapshot ``base`` (:func:`ensure_template`). The import goes to a private temporary name, gets its
   snapshot protected, and is then renamed to the final name; ``rbd rename`` onto an existing name fails with
   EEXIST, so of two concurrent runs (on this host or another sharing the pool) exactly one template wins and the
   loser removes its copy. A template is therefore never visible half-imported.
2. The volume is ``rbd clone <pool>/tmpl-<set>@base <pool>/<volume name>`` (copy-on-write, instant) with the
   ownership mark ``cloud.zjusct.io/owner`` as image-meta; ``cloud.zjusct.io/claimed-by`` (the CloudVM uid) is
   written when a VM first starts on it (:func:`claim`). A failed mark removes the clone again.

The host store's volume record has ``driver: rbd`` and ``location: <pool>/<image>``; the launcher gets
``rootDisk.rbd`` (QEMU opens the image through librbd). A start is refused while the image has a watcher that is
not this VM's live launcher (case V2 of docs/architecture.md "Failure cases", :func:`writer`). Source of the CLI
behaviour: ``rbd(8)`` (Ceph 16) and shared/recipes/ceph.md. Runs on the managed node's Python (standard library +
``rbd``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import (
    META_CLAIMED_BY,
    META_OWNER,
    Connection,
    ImageRef,
    MiB,
    Rbd,
    RbdError,
    check_name,
    parse_image_spec,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

TEMPLATE_PREFIX = "tmpl-"
TEMPLATE_SNAPSHOT = "base"
IMPORT_TIMEOUT_SECONDS = 1800.0
EEXIST = 17


@dataclass(frozen=True)
class RbdSettings:
    """The host config's ``rbd`` dict: pool, conf (path), user (cephx id), keyring_path, cluster (optional)."""

    pool: str
    conf: str = ""
    user: str = ""
    keyring_path: str = ""
    cluster: str = ""

    def connection(self, timeout: float = 120.0) -> Connection:
        return Connection(conf=self.conf or None, cluster=self.cluster or None, user=self.user or None,
                          keyring=self.keyring_path or None, timeout=timeout)

    def as_dict(self) -> dict:
        """The settings as the playbooks pass them on (no secrets: the keyring is a path)."""
        return {"pool": self.pool, "conf": self.conf, "user": self.user, "keyring_path": self.keyring_path,
                "cluster": self.cluster}


def settings(rbd: dict) -> RbdSettings:
    """Validate the host config's ``rbd`` dict.

    Raises:
        VolumeError: a key is unknown, ``pool`` is missing or not a valid Ceph name (named).
    """
    known = {"pool", "conf", "user", "keyring_path", "cluster"}
    unknown = sorted(set(rbd or {}) - known)
    if unknown:
        raise VolumeError(f"host_config: rbd has unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if not (rbd or {}).get("pool"):
        raise VolumeError("host_config: rbd.pool: required when volume_driver is rbd")
    try:
        check_name("host_config: rbd.pool", rbd["pool"])
    except ValueError as exc:
        raise VolumeError(str(exc)) from exc
    return RbdSettings(**{k: str(v) for k, v in rbd.items()})


def _client(rbd: dict, timeout: float = 120.0) -> Rbd:
    return Rbd(settings(rbd).connection(timeout))


def template_ref(pool: str, image_set_dir: str) -> ImageRef:
    """``<pool>/tmpl-<image set directory name>@base``."""
    name = TEMPLATE_PREFIX + os.path.basename(image_set_dir.rstrip("/"))
    return ImageRef(pool, check_name("image", name), TEMPLATE_SNAPSHOT)


def _template_ready(client: Rbd, ref: ImageRef) -> bool:
    snaps = client.snapshots(ref.at(None)) if client.info(ref.at(None)) is not None else []
    return any(s.get("name") == TEMPLATE_SNAPSHOT and str(s.get("protected")) == "true" for s in snaps)


def _remove_template_copy(client: Rbd, ref: ImageRef) -> None:
    """Best-effort removal of a private template import (unprotect, remove snapshot, remove image)."""
    for step in (client.snap_unprotect, client.snap_remove):
        try:
            step(ref.at(TEMPLATE_SNAPSHOT))
        except RbdError:
            pass
    try:
        client.remove(ref.at(None))
    except RbdError:
        pass


@contextlib.contextmanager
def _host_lock(ref: ImageRef) -> Iterator[None]:
    """Serialise the template imports of one RBD image among the runs on this host (a flock).

    Concurrent runs on one host were seen to both report the import of the same template about one time in
    two (tests/integration/ceph/test_volume_rbd.py, Ceph 16), so runs on one host wait for each other and the
    later one finds the template ready; runs on different hosts still rely on ``rbd rename``'s EEXIST.
    """
    directory = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    digest = hashlib.sha256(ref.spec.encode("utf-8")).hexdigest()[:16]
    with _flock.exclusive(os.path.join(directory, f"zjusct-cloud-rbd-template-{digest}.lock")):
        yield


def ensure_template(client: Rbd, pool: str, image_set_dir: str) -> tuple[ImageRef, bool]:
    """Import ``<image_set_dir>/rootfs.raw`` once into ``pool`` as the protected snapshot ``tmpl-<set>@base``.

    Runs on one host are serialised (:func:`_host_lock`); see :func:`_ensure_template`.
    """
    final = template_ref(pool, image_set_dir)
    with _host_lock(final):
        return _ensure_template(client, pool, image_set_dir)


def _ensure_template(client: Rbd, pool: str, image_set_dir: str) -> tuple[ImageRef, bool]:
    """Import ``<image_set_dir>/rootfs.raw`` once into ``pool`` as the protected snapshot ``tmpl-<set>@base``.

    Idempotent and safe under concurrent runs (import under a private name, protect, then ``rbd rename``,
    which fails with EEXIST when another run won).

    Returns:
        (the template snapshot ref, whether this call imported it).

    Raises:
        VolumeError: the rootfs is missing or an rbd call failed (the message names the call).
    """
    final = template_ref(pool, image_set_dir)
    try:
        if _template_ready(client, final):
            return final, False
        source = os.path.join(image_set_dir, "rootfs.raw")
        if not os.path.isfile(source):
            raise VolumeError(f"image: {image_set_dir} has no rootfs.raw")
        tmp = ImageRef(pool, _names.with_suffix(final.image, f".importing-{uuid.uuid4().hex[:8]}", _names.RBD_NAME_MAX))
        try:
            client.import_raw(source, tmp, timeout=IMPORT_TIMEOUT_SECONDS)
            client.snap_create(tmp.at(TEMPLATE_SNAPSHOT))
            client.snap_protect(tmp.at(TEMPLATE_SNAPSHOT))
            client.run(["rename", tmp.spec, final.at(None).spec], json_out=False)
        except RbdError as exc:
            _remove_template_copy(client, tmp)
            if exc.errno != EEXIST:
                raise
        except BaseException:
            _remove_template_copy(client, tmp)
            raise
        else:
            return final, True
        if not _template_ready(client, final):  # another run renamed first: it must be complete
            raise VolumeError(f"image: template {final.spec} exists but its snapshot {TEMPLATE_SNAPSHOT!r} is not"
                              " protected; remove the template image and retry")
        return final, False
    except RbdError as exc:
        raise VolumeError(f"image: cannot prepare the RBD template {final.spec}: {exc}") from exc


def create_clone(rbd: dict, name: str, image: dict, owner: str, size_mib: Optional[int]) -> dict:
    """Make the root volume ``name`` as a clone of the image set's template, marked with ``owner``.

    Args:
        rbd: the host config's ``rbd`` dict.
        name: volume name = RBD image name in the pool.
        image: the image set's manifest with ``dir`` (from :func:`storage.volume.resolve_image`).
        owner: the owning user id (image-meta ``cloud.zjusct.io/owner``).
        size_mib: grow the block device to this many MiB (the guest's file system is not grown); None keeps
            the image's size.

    Returns:
        ``{"location": "<pool>/<name>", "size_mib": int}``.

    Raises:
        VolumeError: the image already exists, the size is below the image's, or an rbd call failed; nothing
            is left behind.
    """
    cfg = settings(rbd)
    client = _client(rbd)
    ref = ImageRef(cfg.pool, check_name("root_volume_claim", name))
    try:
        if client.info(ref) is not None:
            raise VolumeError(f"root_volume_claim: an RBD image {ref.spec} already exists but is not in the host"
                              " store (adopt it with zjusct.cloud.host_volume)")
        template, _imported = ensure_template(client, cfg.pool, image["dir"])
        base_mib = int((client.info(template) or {}).get("size", 0)) // MiB
        if size_mib is not None and size_mib < base_mib:
            raise VolumeError(f"volume_size_mib: {size_mib} is below the image's size {base_mib}")
        client.clone(template, ref)
        try:
            client.meta_set(ref, META_OWNER, owner)
            if size_mib is not None and size_mib > base_mib:
                client.resize(ref, size_mib)
        except BaseException:
            try:
                client.remove(ref)
            except RbdError:
                pass
            raise
        return {"location": ref.spec, "size_mib": max(size_mib or 0, base_mib)}
    except RbdError as exc:
        raise VolumeError(f"root_volume_claim: cannot create RBD volume {ref.spec}: {exc}") from exc


def volume_ref(volume: dict) -> ImageRef:
    """The RBD image of an rbd volume record (``location`` is ``pool/image``)."""
    try:
        return parse_image_spec("location", volume["location"])
    except ValueError as exc:
        raise VolumeError(f"volume {volume.get('name')!r}: {exc}") from exc


def describe_watchers(watchers: list) -> str:
    """``"127.0.0.1:0/123 (client.4198), ..."`` — the format rbd_backup and the runbook use."""
    return ", ".join(f"{w.get('address')} (client.{w.get('client')})" for w in watchers)


def writer(rbd: dict, volume: Optional[dict]) -> Optional[str]:
    """Who else has the volume's RBD image open (its watchers), or None (also for non-rbd volumes).

    Call only when this VM has no live launcher: then every watcher is another writer (case V2: a killed QEMU
    whose watch has not expired, another host's VM, an ``rbd`` client).

    Raises:
        VolumeError: the image is missing or ``rbd status`` failed.
    """
    if volume is None or volume.get("driver") != "rbd":
        return None
    ref = volume_ref(volume)
    try:
        if _client(rbd).info(ref) is None:
            raise VolumeError(f"rootVolumeClaim: RBD image {ref.spec} of volume {volume['name']!r} does not exist")
        watchers = _client(rbd).status(ref)
    except RbdError as exc:
        raise VolumeError(f"rootVolumeClaim: cannot read the watchers of {ref.spec}: {exc}") from exc
    if not watchers:
        return None
    return f"RBD image {ref.spec} has watchers {describe_watchers(watchers)}"


def claim(rbd: dict, volume: dict, vm_uid: str) -> None:
    """Write ``cloud.zjusct.io/claimed-by = vm_uid`` on the volume's image (no-op if already so).

    Raises:
        VolumeError: another uid holds the claim, or an rbd call failed.
    """
    client = _client(rbd)
    ref = volume_ref(volume)
    try:
        marks = client.meta(ref)
        current = marks.get(META_CLAIMED_BY)
        if current == vm_uid:
            return
        if current:
            raise VolumeError(f"rootVolumeClaim: RBD image {ref.spec} is claimed by CloudVM uid {current}")
        client.meta_set(ref, META_CLAIMED_BY, vm_uid)
    except RbdError as exc:
        raise VolumeError(f"rootVolumeClaim: cannot claim {ref.spec}: {exc}") from exc


def claim_mark(rbd: dict, volume: dict) -> Optional[str]:
    """The ``cloud.zjusct.io/claimed-by`` mark of the volume's image, or None.

    Raises:
        VolumeError: the rbd call failed.
    """
    ref = volume_ref(volume)
    try:
        return _client(rbd).meta(ref).get(META_CLAIMED_BY) or None
    except RbdError as exc:
        raise VolumeError(f"rootVolumeClaim: cannot read the marks of {ref.spec}: {exc}") from exc


def release(rbd: dict, volume: dict, vm_uid: str) -> None:
    """Remove the image's ``claimed-by`` mark if it is ``vm_uid`` (no-op when there is none).

    Raises:
        VolumeError: another uid holds the mark (refused, named), or an rbd call failed.
    """
    client = _client(rbd)
    ref = volume_ref(volume)
    try:
        current = client.meta(ref).get(META_CLAIMED_BY)
        if not current:
            return
        if current != vm_uid:
            raise VolumeError(f"rootVolumeClaim: RBD image {ref.spec} is claimed by CloudVM uid {current}, not"
                              f" {vm_uid}")
        client.meta_remove(ref, META_CLAIMED_BY)
    except RbdError as exc:
        raise VolumeError(f"rootVolumeClaim: cannot release {ref.spec}: {exc}") from exc


def delete(rbd: dict, volume: dict) -> None:
    """Remove the volume's image (refused by Ceph while it has watchers: the error names them).

    Raises:
        VolumeError: watchers, snapshots, or an rbd failure.
    """
    client = _client(rbd)
    ref = volume_ref(volume)
    try:
        if client.info(ref) is None:
            return
        watchers = client.status(ref)
        if watchers:
            raise VolumeError(f"delete_volume: RBD image {ref.spec} has watchers {describe_watchers(watchers)}")
        client.snap_purge(ref)
        client.remove(ref)
    except RbdError as exc:
        raise VolumeError(f"delete_volume: cannot remove {ref.spec}: {exc}") from exc


def adopt(rbd: dict, location: str, owner: str, admit: Optional[Callable[[int], None]] = None) -> dict:
    """Check that an existing RBD image may become ``owner``'s root volume and mark it (restore, migration).

    Rules: the image exists in the configured pool, has no watcher, no ``claimed-by`` mark, and its owner mark is
    absent or ``owner`` (then written). Source: the ownership model of docs/rbd.md "Ownership marks".

    Args:
        admit: called with the image's size (MiB) after the rules passed and before the owner mark is written;
            whatever it raises (a quota refusal) propagates with the image left untouched.

    Returns:
        ``{"location": "<pool>/<image>", "size_mib": int, "changed": bool}``.

    Raises:
        VolumeError: naming the rule that refused.
    """
    cfg = settings(rbd)
    try:
        ref = parse_image_spec("rbd_image", location, default_pool=cfg.pool)
    except ValueError as exc:
        raise VolumeError(str(exc)) from exc
    if ref.snapshot:
        raise VolumeError(f"rbd_image: {location!r} names a snapshot; give pool/image")
    client = _client(rbd)
    try:
        info = client.info(ref)
        if info is None:
            raise VolumeError(f"rbd_image: {ref.spec} does not exist")
        watchers = client.status(ref)
        if watchers:
            raise VolumeError(f"rbd_image: {ref.spec} has watchers {describe_watchers(watchers)}")
        marks = client.meta(ref)
        if marks.get(META_CLAIMED_BY):
            raise VolumeError(f"rbd_image: {ref.spec} is claimed by CloudVM uid {marks[META_CLAIMED_BY]}")
        mark = marks.get(META_OWNER)
        if mark and mark != owner:
            raise VolumeError(f"owner: {owner!r} does not match the owner mark {mark!r} of {ref.spec}")
        if admit is not None:
            admit(int(info.get("size", 0)) // MiB)
        if not mark:
            client.meta_set(ref, META_OWNER, owner)
    except RbdError as exc:
        raise VolumeError(f"rbd_image: {ref.spec}: {exc}") from exc
    return {"location": ref.spec, "size_mib": int(info.get("size", 0)) // MiB, "changed": not mark}


def unmark_owner(rbd: dict, location: str) -> None:
    """Remove the owner mark :func:`adopt` wrote on ``location`` (``pool/image``): undoes an adoption refused later.

    Raises:
        VolumeError: the mark could not be removed (the message names the image).
    """
    ref = parse_image_spec("rbd_image", location, default_pool=settings(rbd).pool)
    try:
        _client(rbd).meta_remove(ref, META_OWNER)
    except RbdError as exc:
        raise VolumeError(f"rbd_image: {ref.spec}: removing the owner mark: {exc}") from exc


def root_disk(rbd: dict, volume: dict) -> dict:
    """The launcher's ``rootDisk`` for an rbd volume (launcher-protocol.md: ``rootDisk.rbd``)."""
    cfg = settings(rbd)
    ref = volume_ref(volume)
    source = {"pool": ref.pool, "image": ref.image, "user": cfg.user or "admin"}
    if cfg.conf:
        source["conf"] = cfg.conf
    if cfg.keyring_path:
        source["keyringPath"] = cfg.keyring_path
    return {"rbd": source, "cache": "Writeback"}
