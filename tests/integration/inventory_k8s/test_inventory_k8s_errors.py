"""Clear errors, never a traceback: unreachable API server, bad kubeconfig, unknown option (no cluster needed)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.integration.inventory_k8s.inventory_k8s_helpers import run_inventory, write_inventory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_api_server_is_a_clear_error_and_the_token_stays_secret(tmp_path: Path):
    server = f"https://127.0.0.1:{free_port()}"
    token = "tok-" + "s3cr3t" * 4
    src = write_inventory(tmp_path / "down.cloudvm.yml", host=server, api_key=token, request_timeout=5)
    run = run_inventory(src, "-vvvv", check=False)
    assert run.rc != 0
    assert f"source kubernetes: cannot reach the Kubernetes API at {server}" in run.stderr
    assert "Connection refused" in run.stderr
    assert "Traceback" not in run.stderr
    assert token not in run.stdout + run.stderr, "case A3: the token must never be printed, even with -vvvv"


def test_bad_kubeconfig_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [ {name: x\n")
    run = run_inventory(write_inventory(tmp_path / "bad.cloudvm.yml", kubeconfig=str(bad)), check=False)
    assert run.rc != 0 and f"kubeconfig: {bad} is not valid YAML" in run.stderr
    assert "Traceback" not in run.stderr
    run = run_inventory(write_inventory(tmp_path / "missing.cloudvm.yml", kubeconfig=str(tmp_path / "nope")),
                        check=False)
    assert run.rc != 0 and f"kubeconfig: {tmp_path / 'nope'} does not exist" in run.stderr


def test_unknown_option_is_refused_with_a_suggestion(tmp_path: Path):
    run = run_inventory(write_inventory(tmp_path / "typo.cloudvm.yml", namspaces=["a"]), check=False)
    assert run.rc != 0 and "unknown option 'namspaces' (did you mean 'namespaces'?)" in run.stderr
    run = run_inventory(write_inventory(tmp_path / "phase.cloudvm.yml", source="host", group_by=["rack"]),
                        check=False)
    assert run.rc != 0 and "rack" in run.stderr and "Traceback" not in run.stderr
