"""Each ``cloud.zjusct.io/...`` key (label, annotation, finalizer, extended resource, image-meta key, apiVersion) is
written once: a string literal that is exactly such a key appears in one place of the code, and every other use
imports that name (e.g. ``model.spec.OWNER_MARK``, ``CLAIMED_BY_MARK``, ``API_VERSION``).

plugins/ and controller/ share plugins/module_utils, so a key is written once over both. launcher/ and
localcluster/ import no collection code (their own packages): a key they share with the collection is written
again there only where :data:`TWINS` names it, and this test holds the copies equal (the same literal)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
KEY = re.compile(r"^(?:[a-z]+\.)?cloud\.zjusct\.io/[A-Za-z0-9._-]+$")
# package -> the directories of its code; plugins and controller form one package (the controller imports
# module_utils)
PACKAGES = {
    "collection": ("plugins", "controller/zjusct_controller"),
    "launcher": ("launcher/zjusct_launcher",),
    "localcluster": ("localcluster/zjusct_localcluster",),
}
# a key written in two packages: (the packages, why it cannot be imported)
TWINS = {
    "launcher.cloud.zjusct.io/v1": ({"collection", "launcher"}, "the launcher is a standard-library-only package"),
    "cloud.zjusct.io/bandwidth-mbps": ({"collection", "localcluster"}, "the local cluster imports no collection code"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every docstring constant of ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _key_literals() -> dict[str, list[tuple[str, str]]]:
    """``{key: [(package, "path:line"), ...]}`` of every string literal that is exactly a key."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for package, dirs in PACKAGES.items():
        for folder in dirs:
            for path in sorted((REPO / folder).glob("**/*.py")):
                tree = ast.parse(path.read_text(), str(path))
                skip = _docstrings(tree)
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                            and KEY.match(node.value)):
                        out[node.value].append((package, f"{path.relative_to(REPO)}:{node.lineno}"))
    return out


def test_each_key_is_written_once_per_package() -> None:
    twice = {key: [where for _pkg, where in places] for key, places in _key_literals().items()
             if len({pkg for pkg, _where in places}) != len(places)}
    assert twice == {}, "import the one name of the key instead of writing it again"


def test_a_key_written_in_two_packages_is_a_named_twin() -> None:
    found = {key: {pkg for pkg, _where in places} for key, places in _key_literals().items()}
    shared = {key: pkgs for key, pkgs in found.items() if len(pkgs) > 1}
    assert shared == {key: pkgs for key, (pkgs, _why) in TWINS.items()}


def test_the_ownership_marks_are_the_model_s() -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import backup_events
    from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import CLAIMED_BY_MARK, OWNER_MARK

    assert (OWNER_MARK, CLAIMED_BY_MARK) == ("cloud.zjusct.io/owner", "cloud.zjusct.io/claimed-by")
    assert backup_events._labels("alice", "20260101T000000Z-1") == {
        "cloud.zjusct.io/owner": "alice", "cloud.zjusct.io/backup-id": "20260101T000000Z-1"}
    assert backup_events._labels("not a label!", None) == {}
