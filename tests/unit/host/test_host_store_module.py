"""host_store creates and migrates the host store; reads never do (run through ansible, on a real SQLite file)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


def _run(module: str, config: Path, check: bool = False) -> dict:
    argv = [str(VENV_BIN / "ansible"), "localhost", "-m", f"zjusct.cloud.{module}", "-a",
            json.dumps({"host_config": str(config)})] + (["--check"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(proc.stdout)
    return dict(doc["plays"][0]["tasks"][0]["hosts"]["localhost"])


def test_creates_then_changes_nothing_and_migrates_an_old_schema(tmp_path: Path) -> None:
    store = tmp_path / "state" / "cloud.db"
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"store_path": str(store)}))

    assert _run("cloudvm_info", config)["cloudvms"] == [] and not store.exists(), "a read never creates the store"
    planned = _run("host_store", config, check=True)
    assert planned["changed"] is True and not store.exists()
    created = _run("host_store", config)
    assert created["changed"] is True and created["previous_schema_version"] is None and store.exists()
    again = _run("host_store", config)
    assert again["changed"] is False and again["previous_schema_version"] == again["schema_version"]

    conn = sqlite3.connect(store)
    conn.execute("PRAGMA user_version=1")
    conn.close()
    refused = _run("cloudvm_info", config)
    assert refused.get("failed") and "run site.yml to migrate it" in refused["msg"], refused
    migrated = _run("host_store", config)
    assert migrated["changed"] is True and migrated["previous_schema_version"] == 1
    assert _run("cloudvm_info", config)["cloudvms"] == []
