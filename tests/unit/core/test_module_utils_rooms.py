"""plugins/module_utils is kept in rooms (docs/architecture.md "plugins/module_utils, room by room"): each room
imports only the rooms its row there names, imports are absolute, and every file sits in a room."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.zjusct.cloud.plugins.module_utils"
# room -> the rooms it may import besides itself; "" is the top level (cloudvm_module.py)
ALLOWED = {
    "common": set(),
    "model": {"common"},
    "image": {"common", "model"},
    "network": {"common", "model"},
    "storage": {"common", "model"},
    "cloudvm": {"common", "model"},
    "host": {"common", "model", "cloudvm", "network", "storage"},
    "k8s": {"common", "model", "cloudvm", "storage"},
    "": {"common", "model", "host", "k8s"},
}


def _room(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else ""


def _imported_rooms(path: Path) -> dict[str, int]:
    """``{room: line}`` of every module_utils import in ``path``; relative imports fail the test."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import (write it absolute)"
            module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names] if module == PREFIX else [module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name.startswith(PREFIX + "."):
                first = name[len(PREFIX) + 1:].split(".")[0]
                found.setdefault(first if (ROOT / first).is_dir() else "", node.lineno)
    return found


FILES = sorted(p for p in ROOT.glob("**/*.py") if "__pycache__" not in p.parts)


def test_every_file_is_in_a_room_the_doc_names() -> None:
    rooms = {_room(p) for p in FILES}
    assert rooms == set(ALLOWED)
    assert [p.name for p in FILES if _room(p) == ""] == ["cloudvm_module.py"]
    doc = (REPO / "docs" / "architecture.md").read_text()
    for room in ALLOWED:
        if room:
            assert f"| `{room}/`" in doc, f"{room}/ has no row in docs/architecture.md"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_room_imports_only_the_rooms_it_may(path: Path) -> None:
    room = _room(path)
    bad = {other: line for other, line in _imported_rooms(path).items()
           if other != room and other not in ALLOWED[room]}
    assert bad == {}, f"{room or 'top level'} may import only {sorted(ALLOWED[room])}"
