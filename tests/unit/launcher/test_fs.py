"""The launcher's file writes (fs.py): the atomic write, the result and its termination message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from zjusct_launcher import fs, result


def make(reason: str = "StopRequested") -> result.Result:
    return result.Result(vm={"namespace": "d", "name": "a", "uid": "u", "bootID": 1}, boot_id=1, reason=reason,
                         started_at="2026-01-01T00:00:00.000Z", finished_at="2026-01-01T00:01:00.000Z",
                         message="m", hypervisor_exit_status=0)


def test_atomic_write_creates_parents_leaves_no_temp_and_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "result-1.json"
    fs.write_atomic(str(target), b"old")
    fs.write_atomic(str(target), result.encode(make()))
    assert json.loads(target.read_text())["reason"] == "StopRequested"
    assert sorted(os.listdir(target.parent)) == ["result-1.json"]


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("old")
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError):
        fs.write_atomic(str(tmp_path / "sub"), b"new")  # rename onto a directory fails
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["result.json", "sub"]


def test_publish_writes_result_and_compact_termination_message(tmp_path: Path) -> None:
    res, term = tmp_path / "r.json", tmp_path / "termination-log"
    term.write_text("")
    errors = fs.publish(make(), str(res), str(term))
    assert errors == []
    assert json.loads(res.read_text()) == json.loads(term.read_text())
    assert "\n" not in term.read_text() and len(term.read_bytes()) <= 4096


def test_publish_reports_errors_instead_of_raising(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    errors = fs.publish(make(), str(blocker / "r.json"), None)
    assert len(errors) == 1 and "result.path" in errors[0]
