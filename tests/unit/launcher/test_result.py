"""LauncherResult v1 (result.py): exit codes per reason, schema agreement (writing it: test_fs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from zjusct_launcher import result

SCHEMA = json.loads((Path(result.__file__).parent / "schemas" / "launcher-result-v1.json").read_text())
EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def make(reason: str = "StopRequested") -> result.Result:
    return result.Result(vm={"namespace": "d", "name": "a", "uid": "u", "bootID": 1}, boot_id=1, reason=reason,
                         started_at="2026-01-01T00:00:00.000Z", finished_at="2026-01-01T00:01:00.000Z",
                         message="m", hypervisor_exit_status=0)


def test_exit_codes_follow_the_contract() -> None:
    assert {r for r, c in result.EXIT_CODES.items() if c == 0} == {"GuestShutdown", "GuestReboot", "StopRequested"}
    assert result.EXIT_CODES["ConfigInvalid"] == 2 and result.EXIT_ALREADY_RUNNING == 3
    assert all(c == 1 for r, c in result.EXIT_CODES.items()
               if r not in {"GuestShutdown", "GuestReboot", "StopRequested", "ConfigInvalid"})


@pytest.mark.parametrize("reason", result.REASONS)
def test_every_reason_encodes_to_a_schema_valid_document(reason: str) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    doc = make(reason).as_json()
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(doc)
    assert doc["exitCode"] == result.EXIT_CODES[reason]


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("result-*.json")))
def test_result_examples_are_schema_valid(name: str) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads((EXAMPLES / name).read_text()))


def test_schema_rejects_a_wrong_exit_code_for_the_reason() -> None:
    doc = make("GuestPanic").as_json()
    doc["exitCode"] = 0
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))
