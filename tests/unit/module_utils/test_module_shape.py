"""Every module has the one shape (docs/architecture.md "A module's shape"); failures go through one root."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins import module_utils
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted(p for p in (REPO / "plugins" / "modules").glob("*.py") if p.name != "__init__.py")
VENV_BIN = Path(sys.executable).parent


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_module_file_is_spec_plus_a_two_line_main(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert not any(isinstance(node, ast.Try) for node in ast.walk(tree)), "errors are caught once, in run_module"
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert len(main.body) == 2, ast.unparse(main)
    made, ran = main.body
    assert isinstance(made, ast.Assign) and isinstance(made.value, ast.Call)
    assert ast.unparse(made.value.func) == "AnsibleModule"
    assert isinstance(ran, ast.Expr) and isinstance(ran.value, ast.Call)
    assert ast.unparse(ran.value.func) == "run_module"
    assert ast.unparse(ran.value.args[1]) == f"run_{path.stem}", "the body is run_<module name> in module_utils"


def _error_classes() -> list[type]:
    found = []
    root = REPO / "plugins" / "module_utils"
    for path in sorted(root.glob("**/*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mod = importlib.import_module(f"{module_utils.__name__}.{name}")
        found += [obj for _, obj in inspect.getmembers(mod, inspect.isclass)
                  if issubclass(obj, BaseException) and obj.__module__ == mod.__name__]
    return found


def test_every_error_class_of_module_utils_derives_from_cloud_error() -> None:
    classes = _error_classes()
    assert len(classes) >= 25
    assert [c.__qualname__ for c in classes if not issubclass(c, CloudError)] == []


class _Module:
    """What run_module uses of AnsibleModule; exit_json / fail_json end the run as Ansible's do."""

    def __init__(self, params: dict, check_mode: bool = False, diff: bool = False) -> None:
        self.params, self.check_mode, self._diff = params, check_mode, diff
        self.warnings: list[str] = []
        self.ended: dict = {}

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def exit_json(self, **result: Any) -> None:
        self.ended = dict(result, how="exit")
        raise SystemExit(0)

    def fail_json(self, **result: Any) -> None:
        self.ended = dict(result, how="fail")
        raise SystemExit(1)


def test_run_module_passes_check_mode_and_diff_and_turns_warnings_into_warn() -> None:
    module = _Module({"a": 1}, check_mode=True, diff=True)
    with pytest.raises(SystemExit):
        run_module(module, lambda params, check_mode, diff: {"changed": False, "seen": [params, check_mode, diff],
                                                              "warnings": ["careful"]}, diff=True)
    assert module.ended == {"changed": False, "seen": [{"a": 1}, True, True], "how": "exit"}
    assert module.warnings == ["careful"]


def test_run_module_fails_with_the_message_the_field_and_the_details() -> None:
    def run(params: dict, check_mode: bool) -> dict:
        raise CloudError("vcpus: 99 is above the maximum 4", field="vcpus", reason="QuotaExceeded")

    module = _Module({})
    with pytest.raises(SystemExit):
        run_module(module, run)
    assert module.ended == {"msg": "vcpus: 99 is above the maximum 4", "field": "vcpus", "reason": "QuotaExceeded",
                            "how": "fail"}


def test_run_module_lets_a_bug_keep_its_traceback() -> None:
    def run(params: dict, check_mode: bool) -> dict:
        raise KeyError("not a CloudError")

    with pytest.raises(KeyError):
        run_module(_Module({}), run)


def test_errors_keep_their_other_bases_and_payloads() -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import FsError
    from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import Problem
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_io import BackupError
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import UnknownDriver
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import RbdNotFound

    assert isinstance(FsError("x"), OSError) and str(FsError("cannot unmount /a: busy")) == "cannot unmount /a: busy"
    assert isinstance(UnknownDriver("x"), ValueError)
    refused = CloudVMError("spec.vcpus: 9 is above the maximum 4", reason="Invalid", errors=["spec.vcpus"])
    assert refused.failure() == {"reason": "Invalid", "errors": ["spec.vcpus"]}
    problem = Problem(backup="b1", where="image", index=3, start=0, end=1, message="chunk 3 differs")
    assert BackupError("verification failed", [problem]).failure() == {"problems": ["chunk 3 differs"]}
    assert BackupError("no backup").failure() == {"problems": []}
    gone = RbdNotFound("image rbd/x does not exist", command="info", errno=2)
    assert (gone.errno, gone.command, gone.failure()) == (2, "info", {})


def test_a_failure_through_ansible_names_the_field() -> None:
    argv = [str(VENV_BIN / "ansible"), "localhost", "-m", "zjusct.cloud.guest_image_workdir", "-a",
            json.dumps({"path": "relative/dir"})]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["failed"] is True and result["field"] == "path", result
    assert result["msg"] == "path: 'relative/dir' must be an absolute path other than /"
