# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one rule for names derived from user input that must fit a length limit.

A derived name is built from a *subject* (a device name, a VM name, an image name ...) and has to fit a limit
set by the kernel or by an API. Cutting the subject to the limit makes two subjects that share the cut prefix
collide (``vmtap-alice-01`` and ``vmtap-alice-02`` both gave the IFB ``zqivmtap-alice-``), so every derivation in
this collection goes through :func:`fit`:

* the full name is used as it is when it is **shorter** than the limit;
* otherwise it is the full name's first ``limit - HASH_HEX`` characters followed by the first HASH_HEX (8) hex
  digits of sha256(full name): exactly ``limit`` characters, readable prefix, stable across runs and hosts.

A name used verbatim is always shorter than the limit and a hashed one is always exactly the limit, so a
verbatim name never equals a hashed one; two distinct full names that are both hashed collide only when their
prefixes are equal and 32 bits of sha256 agree. That residue (and names an operator gives explicitly) is why
every object found under a derived name is ownership-checked before it is reused (e.g. the IFB's ifalias names
the device it was created for, :mod:`network.tc`); a mismatch is refused, never taken over.

Limits and their sources:

* IFNAME_MAX = 15: a Linux interface name is at most IFNAMSIZ - 1 characters (IFNAMSIZ is 16 including the
  terminating NUL, include/uapi/linux/if.h; dev_valid_name() in net/core/dev.c).
* DNS1123_LABEL_MAX = 63, DNS1123_SUBDOMAIN_MAX = 253: Kubernetes object names and host names (RFC 1123 as
  applied by Kubernetes, k8s.io/apimachinery/pkg/util/validation: IsDNS1123Label / IsDNS1123Subdomain; API
  conventions "Naming"). A label is ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``.
* RBD_NAME_MAX = 250: pool, image and snapshot names accepted by this collection (:func:`storage.rbd.check_name`); Ceph
  stores a format-2 image name in the object names ``rbd_id.<name>`` (RADOS object names are limited by
  ``osd_max_object_name_len``, 2048 by default), so 250 is the collection's own, stricter bound.
* FIRECRACKER_ID_MAX = 64: Firecracker's ``--id`` (1-64 alphanumerics and ``-``, firecracker src/utils
  validators).

The launcher (a separate package that cannot import the collection) applies the same rule in
``zjusct_launcher/names.py`` to host names and Firecracker ids; tests/unit/model/test_names.py checks that both
give the same names.
"""

from __future__ import annotations

import hashlib

HASH_HEX = 8
IFNAME_MAX = 15
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
RBD_NAME_MAX = 250
FIRECRACKER_ID_MAX = 64

IFB_PREFIX = "zqi"
TAP_PREFIX = "zjt"


def digest(subject: str, hex_digits: int = HASH_HEX) -> str:
    """The first ``hex_digits`` lower-case hex digits of sha256(subject, UTF-8)."""
    return hashlib.sha256(subject.encode("utf-8")).hexdigest()[:hex_digits]


def fit(full: str, limit: int) -> str:
    """``full`` when it is shorter than ``limit``, else its cut prefix + :func:`digest` (exactly ``limit`` chars).

    Args:
        full: the whole derived name (prefix + subject), in the character set of the target kind.
        limit: maximum length in characters, > HASH_HEX.

    Returns:
        a name of at most ``limit`` characters; equal inputs give equal names; names that are hashed keep the
        characters of ``full`` in front of the hex digits, so they stay in the character set if ``full`` was.

    Raises:
        ValueError: ``limit`` leaves no room for the hash.
    """
    if limit <= HASH_HEX:
        raise ValueError(f"limit: {limit} leaves no room for {HASH_HEX} hash digits")
    if len(full) < limit:
        return full
    return full[:limit - HASH_HEX] + digest(full)


def ifname(prefix: str, subject: str) -> str:
    """A network interface name ``prefix + subject`` within IFNAME_MAX (15) characters (see :func:`fit`)."""
    return fit(prefix + subject, IFNAME_MAX)


def ifb_name(device: str) -> str:
    """The IFB that shapes ``device``'s ingress: ``zqi`` + device, hashed when 15 characters or longer.

    The one rule for tc_qos's default ``ifb`` and the host backend's bandwidth code. Examples:
    ``tap0`` -> ``zqitap0``; ``vmtap-alice-01`` -> ``zqivmta`` + 8 hex digits.
    """
    return ifname(IFB_PREFIX, device)


def tap_name(vm_uid: str) -> str:
    """A VM's TAP on the host backend: ``zjt`` + 10 hex digits of sha256(uid) (13 characters, below IFNAME_MAX).

    The uid is not part of the name (it is longer than the limit allows), so the name is always the hash.
    """
    return TAP_PREFIX + digest(vm_uid, 10)


def with_suffix(base: str, suffix: str, limit: int) -> str:
    """``base + suffix`` within ``limit``: the base goes through :func:`fit` for ``limit - len(suffix)``.

    For names that must end with a fixed marker (e.g. an RBD image ``<image>.importing-<random>``).
    """
    return fit(base, limit - len(suffix)) + suffix
