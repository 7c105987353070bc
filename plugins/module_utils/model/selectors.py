# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes label selectors (pure): the one parser of the collection, for the host backend's ``cloudvm_info`` and
the inventory plugin's host source (the Kubernetes ones send the text to kube-apiserver unchanged).

The grammar is kube-apiserver's (k8s.io/apimachinery/pkg/labels/selector.go): requirements joined by ``,``, each
``key=value`` / ``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a)``, ``key`` (exists) or ``!key``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class SelectorError(CloudError, ValueError):
    """A label selector that cannot be parsed; the message starts with ``label_selector:`` and names the part."""


@dataclass(frozen=True)
class Requirement:
    """One label selector requirement: ``op`` is ``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict) -> bool:
        """Whether a label map satisfies this requirement (Kubernetes semantics: ``!=`` and ``notin``
        match objects without the key)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin


_SET_RE = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_label_selector(text: str, option: str = "label_selector") -> tuple[Requirement, ...]:
    """Parse a Kubernetes label selector (``a=b,c!=d,e in (f,g),h notin (i),j,!k``).

    The grammar is the one of kube-apiserver (k8s.io/apimachinery/pkg/labels/selector.go, see the module
    docstring); a Kubernetes caller sends the text unchanged to the server, the host evaluates it here.

    Args:
        text: the selector.
        option: what the user typed it as, the start of an error's message.

    Raises:
        SelectorError: a requirement cannot be parsed (named in the message).
    """
    if not text or not text.strip():
        return ()
    out = []
    for part in _split_top(text):
        if not part:
            raise SelectorError(f"{option}: {text!r} has an empty requirement")
        m = _SET_RE.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group("values").split(",") if v.strip())
            req = Requirement(m.group("key"), m.group("op"), values)
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            req = Requirement(key, "!=", frozenset({value}))
        elif "==" in part or "=" in part:
            key, value = (s.strip() for s in re.split("==?", part, maxsplit=1))
            req = Requirement(key, "=", frozenset({value}))
        elif part.startswith("!"):
            req = Requirement(part[1:].strip(), "!")
        else:
            req = Requirement(part, "exists")
        if not _LABEL_KEY.match(req.key):
            raise SelectorError(f"{option}: {part!r} has an invalid label key {req.key!r}")
        out.append(req)
    return tuple(out)


def matches(requirements: tuple[Requirement, ...], labels: dict) -> bool:
    """Whether a label map satisfies every requirement (an empty selector matches everything)."""
    return all(req.matches(labels) for req in requirements)
