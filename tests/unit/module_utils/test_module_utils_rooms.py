"""plugins/module_utils is kept in rooms (docs/architecture.md "plugins/module_utils, room by room"): each room
imports only the rooms its row there names, imports are absolute, and every file sits in a room.

And a module's body has one place (docs/architecture.md "Where a module's body lives"): module X's body is
``run_X`` in ``<room>/X_module.py`` (the top level for the modules with both backends), the only file of that name
and the only one defining ``run_X``; nothing in the collection's code but plugins/modules/X.py imports it (tests
may), so code two bodies share lives beside them in a file of its concern, never in another module's body."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.zjusct.cloud.plugins.module_utils"
# room -> the rooms it may import besides itself; "" is the top level (backend.py and the bodies of the modules with
# both backends)
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
    assert [p.name for p in FILES if _room(p) == ""] == [
        "backend.py", "cloudvm_info_module.py", "cloudvm_module.py", "owner_quota_module.py", "rbd_backup_module.py",
        "root_volume_info_module.py", "volume_backup_module.py"]
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


MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.name != "__init__.py")
BODIES = {p.stem[:-len("_module")]: p for p in FILES if p.stem.endswith("_module")}
# the collection's code (tests excluded): every file that might import a body
CODE = sorted(p for folder in ("plugins", "controller", "launcher", "localcluster")
              for p in (REPO / folder).glob("**/*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> str:
    return PREFIX + "." + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path: Path) -> set[str]:
    """Every module_utils module ``path`` imports (``from X import y`` counts X and X.y)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_every_module_has_one_body_file_named_for_it_and_every_body_file_a_module() -> None:
    assert sorted(BODIES) == MODULES
    assert len({p.stem for p in BODIES.values()}) == len(BODIES), "one X_module.py per module, in one room"


@pytest.mark.parametrize("module", MODULES)
def test_the_body_run_x_is_defined_only_in_its_body_file_and_the_module_runs_it_from_there(module: str) -> None:
    run = f"run_{module}"
    defining = [p for p in FILES if any(isinstance(n, ast.FunctionDef) and n.name == run
                                        for n in ast.parse(p.read_text()).body)]
    assert defining == [BODIES[module]]
    body_file = ast.parse(BODIES[module].read_text())
    others = [n.name for n in body_file.body if isinstance(n, ast.FunctionDef) and n.name.startswith("run_")
              and n.name[len("run_"):] in MODULES and n.name != run]
    assert others == [], "one module's body per file"
    assert f"{_dotted(BODIES[module])}.{run}" in _imports(REPO / "plugins" / "modules" / f"{module}.py")


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_but_its_module_imports_a_body_file(path: Path) -> None:
    imported = _imports(path)
    bad = sorted(module for module, body in BODIES.items() if _dotted(body) in imported
                 and path != REPO / "plugins" / "modules" / f"{module}.py")
    assert bad == [], "shared code lives beside the bodies, in a file of its concern"
