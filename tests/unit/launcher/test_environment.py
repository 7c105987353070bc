"""The read-only checks of the files a config names (environment.py), each problem naming its field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zjusct_launcher import config, environment

EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def example(name: str = "config-qemu-tap.json") -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


def test_environment_problems_name_missing_files(tmp_path: Path) -> None:
    cfg = config.parse(example())
    found = environment.environment_problems(cfg)
    assert any(p.startswith("boot.kernel: ") and "does not exist" in p for p in found)
    assert any(p.startswith("rootDisk.path: ") for p in found)
    assert any(p.startswith("network.tap: ") for p in found)


def test_firecracker_needs_an_elf_kernel(tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"MZ\x00\x00bzImage")
    doc = example("config-firecracker-tap.json")
    doc["boot"]["kernel"] = str(kernel)
    found = environment.environment_problems(config.parse(doc))
    assert any("is not an uncompressed ELF vmlinux" in p for p in found), found
