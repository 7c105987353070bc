"""Names the launcher derives from the VM's Kubernetes name, kept within their limits without collisions.

Same rule as the collection's plugins/module_utils/model/names.py (the launcher is a separate package and cannot
import it; tests/unit/model/test_names.py checks that both give the same names): a derived name is used as it is
when it is valid and shorter than the limit, otherwise it is a readable cut followed by 8 hex digits of
sha256(subject), so two subjects that share the cut prefix still get different names.

Limits: a DNS-1123 label is at most 63 characters of ``[a-z0-9-]``, starting and ending alphanumeric (RFC 1123 as
applied by Kubernetes, k8s.io/apimachinery/pkg/util/validation IsDNS1123Label); Firecracker's ``--id`` is 1-64
characters of ``[A-Za-z0-9-]``.
"""

from __future__ import annotations

import hashlib
import re

HASH_HEX = 8
DNS1123_LABEL_MAX = 63
FIRECRACKER_ID_MAX = 64

_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
_NOT_FC_ID = re.compile(r"[^A-Za-z0-9-]")


def digest(subject: str, hex_digits: int = HASH_HEX) -> str:
    """The first ``hex_digits`` lower-case hex digits of sha256(subject, UTF-8)."""
    return hashlib.sha256(subject.encode("utf-8")).hexdigest()[:hex_digits]


def fit(full: str, limit: int) -> str:
    """``full`` when shorter than ``limit``, else ``full[:limit - 8]`` + :func:`digest` (exactly ``limit``)."""
    if limit <= HASH_HEX:
        raise ValueError(f"limit: {limit} leaves no room for {HASH_HEX} hash digits")
    if len(full) < limit:
        return full
    return full[:limit - HASH_HEX] + digest(full)


def dns_label(subject: str) -> str:
    """A DNS-1123 label (<= 63 characters) for ``subject``, e.g. the default host name from ``vm.name``.

    ``subject`` itself when it is a label shorter than 63 characters; otherwise lower-cased, every run of
    characters outside ``[a-z0-9-]`` replaced by ``-``, cut, and suffixed with ``-`` + 8 hex digits of
    sha256(subject). Examples: ``alice`` -> ``alice``; ``web.alice`` -> ``web-alice-`` + 8 hex digits.
    """
    if len(subject) < DNS1123_LABEL_MAX and _LABEL_RE.fullmatch(subject):
        return subject
    readable = _NOT_LABEL.sub("-", subject.lower()).strip("-")
    readable = readable[:DNS1123_LABEL_MAX - HASH_HEX - 1].strip("-")
    return (readable + "-" if readable else "") + digest(subject)


def firecracker_id(subject: str) -> str:
    """A Firecracker ``--id`` (1-64 of ``[A-Za-z0-9-]``) for ``subject`` (``<namespace>-<name>``).

    ``subject`` itself when valid and shorter than 64 characters; otherwise other characters become ``-`` and
    the result goes through :func:`fit` for 64 with the hash of the original subject.
    """
    if 0 < len(subject) < FIRECRACKER_ID_MAX and not _NOT_FC_ID.search(subject):
        return subject
    clean = _NOT_FC_ID.sub("-", subject)
    return clean[:FIRECRACKER_ID_MAX - HASH_HEX] + digest(subject)
