"""What the room-map tests of the launcher and the controller share (tests/unit/launcher/test_launcher_rooms.py,
tests/unit/controller/test_controller_rooms.py): reading a table of rooms in docs/architecture.md and finding calls
of the built-ins that reach the system."""

from __future__ import annotations

import ast
import re
from pathlib import Path

EFFECT_BUILTINS = {"open", "print", "input", "exec", "eval", "compile", "__import__", "breakpoint"}


def doc_rooms(doc: Path, heading: str) -> dict[str, set[str]]:
    """``{room: {module}}`` from the table under ``heading`` in ``doc``: each row's first cell names the room in
    backticks, its second cell the files (``name.py``) in backticks.

    Raises:
        AssertionError: ``doc`` has no section ``heading``.
    """
    text = doc.read_text()
    assert heading in text, f"{doc.name} has no section {heading!r}"
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rooms: dict[str, set[str]] = {}
    for line in section.splitlines():
        match = re.match(r"^\| `(\w+)`", line)
        if match:
            cells = line.split("|")
            rooms[match.group(1)] = {m[:-3] for m in re.findall(r"`([\w]+\.py)`", cells[2])}
    return rooms


def effect_builtin_calls(tree: ast.AST, name: str) -> list[str]:
    """``<name>:<line>: calls <builtin>()`` for each call of an :data:`EFFECT_BUILTINS` built-in in ``tree``."""
    return [f"{name}:{node.lineno}: calls {node.func.id}()" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EFFECT_BUILTINS]
