"""controller/zjusct_controller is kept in rooms (docs/architecture.md "controller/zjusct_controller, room by room"):
every file sits in the room its row names, each room imports only the rooms it may, and the decisions do nothing to
the system.

The rule for the **decisions** room, checked over every import statement of the file (module level or inside a
function) and every call of a built-in:

* controller modules: only the decisions' own (never the caches, the Ceph fence, the metrics, the leader election,
  the reconcile or the kopf handlers);
* the collection: only ``plugins/module_utils/model`` (the pure room of
  tests/unit/module_utils/test_module_utils_rooms.py) and, of ``network/hostnet.py``, only the names of
  :data:`HOSTNET_PURE` (string builders; the module also runs ``nft`` and ``ip``, which the decisions never import);
* standard library: only the modules of :data:`PURE_STDLIB`, which compute;
* nothing else: no Kubernetes client, kopf, prometheus_client, threads, clock, subprocess, sockets, os;
* no call of the built-ins that reach the system (:data:`tests.unit.rooms.EFFECT_BUILTINS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.rooms import doc_rooms, effect_builtin_calls

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "controller" / "zjusct_controller"
PACKAGE = "zjusct_controller"
DOC = REPO / "docs" / "architecture.md"
HEADING = "### controller/zjusct_controller, room by room"

ROOMS = {
    "decisions": {"config", "decide", "observe", "pod", "refusal", "volume"},
    "adapters": {"cache", "fence", "leader", "metrics", "reconcile"},
    "process": {"__main__", "operator"},
    "package": {"__init__", "_collection"},
}
# room -> the rooms it may import besides itself
ALLOWED = {"decisions": set(), "adapters": {"decisions"}, "process": {"decisions", "adapters"}, "package": set()}

COLLECTION = "ansible_collections.zjusct.cloud.plugins.module_utils"
PURE_COLLECTION_ROOM = f"{COLLECTION}.model"
HOSTNET = f"{COLLECTION}.network.hostnet"
HOSTNET_PURE = {"isolation_script"}
PURE_STDLIB = {"__future__", "collections.abc", "dataclasses", "json", "math", "posixpath", "re", "typing"}

FILES = sorted(ROOT.glob("*.py"))


def _room(module: str) -> str:
    found = [room for room, members in ROOMS.items() if module in members]
    assert len(found) == 1, f"{module}.py is in {found or 'no room'}"
    return found[0]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(tree: ast.Module, path: Path) -> tuple[dict[str, int], list[tuple[str, list[str], int]]]:
    """``({controller module: line}, [(other module, names imported from it ([] for ``import x``), line)])`` of
    every import in ``tree``. Relative imports name the package (``from . import x``, ``from .x import y``); an
    import from above the package fails the test."""
    modules = {p.stem for p in FILES}
    own: dict[str, int] = {}
    other: list[tuple[str, list[str], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level <= 1, f"{path.name}:{node.lineno}: import from above {PACKAGE}"
            mod = node.module or ""
            if node.level == 1 or mod == PACKAGE:
                if mod in ("", PACKAGE):
                    for alias in node.names:
                        own.setdefault(alias.name if alias.name in modules else "__init__", node.lineno)
                else:
                    own.setdefault(mod.split(".")[0], node.lineno)
            elif mod.startswith(PACKAGE + "."):
                own.setdefault(mod.split(".")[1], node.lineno)
            else:
                other.append((mod, [alias.name for alias in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE:
                    own.setdefault("__init__", node.lineno)
                elif alias.name.startswith(PACKAGE + "."):
                    own.setdefault(alias.name.split(".")[1], node.lineno)
                else:
                    other.append((alias.name, [], node.lineno))
    return own, other


def decision_problems(path: Path) -> list[str]:
    """Every way ``path`` breaks the decisions' rule (module docstring), one sentence each with its line."""
    tree = _tree(path)
    own, other = _imports(tree, path)
    problems = [f"{path.name}:{line}: imports {module}.py, a module of the {_room(module)} room"
                for module, line in own.items() if module in {p.stem for p in FILES} - ROOMS["decisions"]]
    for module, names, line in other:
        if module == PURE_COLLECTION_ROOM or module.startswith(PURE_COLLECTION_ROOM + "."):
            continue
        if module == f"{COLLECTION}.network" and names == ["hostnet"]:
            problems.append(f"{path.name}:{line}: imports network.hostnet whole (only {sorted(HOSTNET_PURE)})")
        elif module == HOSTNET:
            problems += [f"{path.name}:{line}: imports {name} from network.hostnet (only {sorted(HOSTNET_PURE)})"
                         for name in names if name not in HOSTNET_PURE]
        elif module.startswith("ansible_collections."):
            problems.append(f"{path.name}:{line}: imports {module} (of the collection only model/ and "
                            "network.hostnet's string builders)")
        elif module not in PURE_STDLIB:
            problems.append(f"{path.name}:{line}: imports {module}, an effect module")
    problems += effect_builtin_calls(tree, path.name)
    return problems


def _doc_rooms() -> dict[str, set[str]]:
    """``{room: {module}}`` from the table under HEADING in docs/architecture.md."""
    return doc_rooms(DOC, HEADING)


def test_every_file_is_in_exactly_one_room_and_the_doc_lists_the_same_rooms() -> None:
    modules = {p.stem for p in FILES}
    assert set().union(*ROOMS.values()) == modules, "a controller file is in no room (or a room names a lost file)"
    for module in modules:
        _room(module)
    assert _doc_rooms() == ROOMS


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_room_imports_only_the_rooms_it_may(path: Path) -> None:
    room = _room(path.stem)
    own, _other = _imports(_tree(path), path)
    bad = {m: line for m, line in own.items() if _room(m) != room and _room(m) not in ALLOWED[room]}
    assert bad == {}, f"{path.name} ({room}) may import only {sorted(ALLOWED[room] | {room})} (module: line)"


@pytest.mark.parametrize("path", [p for p in FILES if p.stem in ROOMS["decisions"]], ids=lambda p: p.name)
def test_a_decision_module_imports_no_effect(path: Path) -> None:
    assert decision_problems(path) == []


def test_the_decisions_rule_catches_each_kind_of_effect(tmp_path: Path) -> None:
    """The checker itself: each line below is one effect it must name."""
    src = tmp_path / "bad.py"
    src.write_text(f"from .reconcile import Reconciler\nfrom .cache import Store\nimport kubernetes\n"
                   f"from kopf import on\nimport time\nfrom os import path\nimport threading\n"
                   f"from {COLLECTION}.network.hostnet import apply_isolation\n"
                   f"from {COLLECTION}.network import hostnet\n"
                   f"from {COLLECTION}.storage.rbd import Rbd\nopen('/x')\n"
                   f"from {COLLECTION}.model.spec import with_defaults\n"
                   f"from {COLLECTION}.network.hostnet import isolation_script\nfrom .pod import pod_name\n"
                   "import json\n")
    found = decision_problems(src)
    for expected in (":1: imports reconcile.py", ":2: imports cache.py", "imports kubernetes", "imports kopf",
                     "imports time", "imports os", "imports threading", "apply_isolation from network.hostnet",
                     "network.hostnet whole", "storage.rbd", "calls open()"):
        assert any(expected in p for p in found), (expected, found)
    assert not any(f":{n}:" in p for p in found for n in (12, 13, 14, 15)), found  # model/, the script, pod, json
