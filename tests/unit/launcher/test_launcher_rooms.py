"""launcher/zjusct_launcher is kept in rooms (docs/architecture.md "launcher/zjusct_launcher, room by room"): every
file sits in the room its row names, each room imports only the rooms it may, and the pure room does nothing to the
system.

The rule for **pure**, checked over every import statement of the file (module level or inside a function) and
every use of what it imports:

* launcher modules: only pure ones;
* standard library: only the modules of :data:`PURE_STDLIB`; of those with effects beside their computing part,
  only the names listed (``os``: the string functions of ``os.path``; ``signal``: the ``Signals`` enum; ``io``:
  ``BytesIO``; ``tarfile``: an archive built in memory, ``tarfile.open`` only with ``fileobj=``);
* no call of the built-ins that reach the system (:data:`tests.unit.rooms.EFFECT_BUILTINS`: ``open``, ``print``, ...).

Anything else (subprocess, socket, select, fcntl, ctypes, shutil, tempfile, threading, time, resource, sys, the
rest of os) is an effect, and a module that imports it belongs to the effects, VMM or run room.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.rooms import doc_rooms, effect_builtin_calls

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "launcher" / "zjusct_launcher"
PACKAGE = "zjusct_launcher"
DOC = REPO / "docs" / "architecture.md"
HEADING = "### launcher/zjusct_launcher, room by room"

ROOMS = {
    "pure": {"__init__", "capability", "config", "decide", "firecracker", "identity", "names", "paths", "qemu",
             "result"},
    "effects": {"console", "environment", "firecracker_api", "fs", "kvm", "lock", "log", "qmp", "readiness", "tap"},
    "vmm": {"vmm", "vmm_firecracker", "vmm_qemu"},
    "run": {"__main__", "cli", "runner"},
}
# room -> the rooms it may import besides itself
ALLOWED = {"pure": set(), "effects": {"pure"}, "vmm": {"pure", "effects"}, "run": {"pure", "effects", "vmm"}}
# What belongs to one VMM only: the run room reaches a VMM through vmm.py alone.
ONE_VMM = {"qemu", "firecracker", "qmp", "firecracker_api", "vmm_qemu", "vmm_firecracker"}
VMM_ADAPTERS = {"vmm_qemu", "vmm_firecracker"}
VMM_TYPE_NAMES = {"qemu", "firecracker"}

ANY = None
# standard-library module -> the names a pure module may use from it (ANY: all of it computes)
PURE_STDLIB: dict[str, set[str] | None] = {
    "__future__": ANY, "collections.abc": ANY, "dataclasses": ANY, "hashlib": ANY, "ipaddress": ANY, "json": ANY,
    "re": ANY, "typing": ANY,
    "io": {"BytesIO"},
    "os": {"path.basename", "path.dirname", "path.join", "path.normpath"},
    "signal": {"Signals"},
    "tarfile": {"TarInfo", "USTAR_FORMAT", "open"},
}

FILES = sorted(p for p in ROOT.glob("*.py"))


def _module(path: Path) -> str:
    return path.stem


def _room(module: str) -> str:
    found = [room for room, members in ROOMS.items() if module in members]
    assert len(found) == 1, f"{module}.py is in {found or 'no room'}"
    return found[0]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _launcher_imports(tree: ast.Module, path: Path) -> dict[str, int]:
    """``{launcher module: line}`` of every import of a launcher module (``__init__`` for names of the package)."""
    modules = {_module(p) for p in FILES}
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import (write it absolute)"
            mod = node.module or ""
            if mod == PACKAGE:
                for alias in node.names:
                    found.setdefault(alias.name if alias.name in modules else "__init__", node.lineno)
            elif mod.startswith(PACKAGE + "."):
                found.setdefault(mod.split(".")[1], node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE:
                    found.setdefault("__init__", node.lineno)
                elif alias.name.startswith(PACKAGE + "."):
                    found.setdefault(alias.name.split(".")[1], node.lineno)
    return found


def _stdlib_imports(tree: ast.Module) -> list[tuple[str, str | None, str, int]]:
    """``(module, name imported from it or None, local alias, line)`` of every non-launcher import."""
    out: list[tuple[str, str | None, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith(PACKAGE):
                    out.append((alias.name, None, alias.asname or alias.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(PACKAGE):
            for alias in node.names:
                out.append((node.module or "", alias.name, alias.asname or alias.name, node.lineno))
    return out


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def pure_problems(path: Path) -> list[str]:
    """Every way ``path`` breaks the pure rule (module docstring), one sentence each with its line."""
    tree = _tree(path)
    problems: list[str] = []
    restricted: dict[str, set[str]] = {}  # local alias of a restricted module -> its allowed names
    for module, name, local, line in _stdlib_imports(tree):
        if module not in PURE_STDLIB:
            problems.append(f"{path.name}:{line}: imports {module}, an effect module")
            continue
        allowed = PURE_STDLIB[module]
        if allowed is ANY:
            continue
        if name is None:
            restricted[local] = allowed
        elif name not in allowed:
            problems.append(f"{path.name}:{line}: imports {name} from {module} (a pure module may use only "
                            f"{', '.join(sorted(allowed))})")
    parents = _parents(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in restricted and isinstance(node.ctx, ast.Load):
            chain, top = [], node
            while isinstance(parents.get(top), ast.Attribute) and parents[top].value is top:  # type: ignore[attr-defined]
                top = parents[top]
                chain.append(top.attr)  # type: ignore[attr-defined]
            used = ".".join(chain)
            if used not in restricted[node.id]:
                problems.append(f"{path.name}:{node.lineno}: uses {node.id}{'.' + used if used else ''} (a pure "
                                f"module may use only {', '.join(sorted(restricted[node.id]))})")
            if node.id == "tarfile" and used == "open":
                call = parents.get(top)
                if not (isinstance(call, ast.Call) and call.func is top
                        and any(k.arg == "fileobj" for k in call.keywords)):
                    problems.append(f"{path.name}:{node.lineno}: tarfile.open without fileobj= (a file on disk)")
    problems += effect_builtin_calls(tree, path.name)
    return problems


def _doc_rooms() -> dict[str, set[str]]:
    """``{room: {module}}`` from the table under HEADING in docs/architecture.md."""
    return doc_rooms(DOC, HEADING)


def test_every_file_is_in_exactly_one_room_and_the_doc_lists_the_same_rooms() -> None:
    modules = {_module(p) for p in FILES}
    assert set().union(*ROOMS.values()) == modules, "a launcher file is in no room (or a room names a lost file)"
    for module in modules:
        _room(module)
    assert _doc_rooms() == ROOMS


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_room_imports_only_the_rooms_it_may(path: Path) -> None:
    room = _room(_module(path))
    imported = _launcher_imports(_tree(path), path)
    bad = {m: line for m, line in imported.items() if _room(m) != room and _room(m) not in ALLOWED[room]}
    assert bad == {}, f"{path.name} ({room}) may import only {sorted(ALLOWED[room] | {room})} (module: line)"


@pytest.mark.parametrize("path", [p for p in FILES if _module(p) in ROOMS["pure"]], ids=lambda p: p.name)
def test_a_pure_module_does_nothing_to_the_system(path: Path) -> None:
    assert pure_problems(path) == []


def test_a_vmm_adapter_never_imports_another_and_the_run_room_names_no_hypervisor() -> None:
    for path in FILES:
        module = _module(path)
        tree = _tree(path)
        imported = set(_launcher_imports(tree, path))
        if module in VMM_ADAPTERS:
            assert imported & (VMM_ADAPTERS - {module}) == set(), f"{path.name} imports another VMM"
        if module in ROOMS["run"]:
            assert imported & ONE_VMM == set(), f"{path.name} imports a module of one VMM (reach it through vmm.py)"
            named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in VMM_TYPE_NAMES}
            assert named == set(), f"{path.name} branches on a hypervisor type ({named}); ask the run's Vmm"


def test_the_pure_rule_catches_each_kind_of_effect(tmp_path: Path) -> None:
    """The checker itself: each line below is one effect it must name."""
    src = tmp_path / "bad.py"
    src.write_text("import os\nimport subprocess\nimport tarfile\nfrom os import getpid\nfrom signal import signal\n"
                   "os.path.isfile('/x')\nos.unlink('/x')\ntarfile.open('/x')\nopen('/x')\nprint(os)\n"
                   "os.path.join('a', 'b')\ntarfile.open(fileobj=None, mode='w')\n")
    found = pure_problems(src)
    for expected in ("imports subprocess", "imports getpid from os", "imports signal from signal", "os.path.isfile",
                     "os.unlink", "tarfile.open without fileobj", "calls open()", "calls print()", "uses os (a"):
        assert any(expected in p for p in found), (expected, found)
    assert not any(":11:" in p or ":12:" in p for p in found), found  # os.path.join, an in-memory archive: pure
