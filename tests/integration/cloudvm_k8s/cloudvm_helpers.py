"""Helpers for the CloudVM tests against the real control plane: CloudVM access as kubectl would do it and
ansible-playbook runs of the modules from this checkout.

Every status these tests wait on comes from the real controller (tests/integration/controller_process.py): on the
shared control plane (no kubelet: launcher Pods are created, never run) and on the real node
(tests/integration/k8s_node: guests boot).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(os.environ.get("ZJUSCT_VENV", "/var/cache/zjusct-cloud/venv")) / "bin"
CRD_FILE = REPO / "config" / "crd" / "cloudvms.cloud.zjusct.io.yaml"
QUOTA_CRD_FILE = REPO / "config" / "crd" / "cloudquotas.cloud.zjusct.io.yaml"
AGGREGATE_ROLES = REPO / "config" / "rbac" / "aggregate-roles.yaml"
OWNER_POLICY = REPO / "config" / "policy" / "owner-admission.yaml"
PLAY_TIMEOUT = 300  # seconds for one ansible-playbook run


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of a manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class CloudVMs:
    """Thin helpers over CustomObjectsApi for CloudVMs."""

    api: Any

    def create(self, ns: str, name: str, **spec: Any) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": name},
                "spec": {"owner": "alice", "rootVolumeClaim": f"{name}-root", **spec}}
        return dict(self.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body))

    def get(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_spec(self, ns: str, name: str, **spec: Any) -> dict[str, Any]:
        return dict(self.api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec}))

    def set_status(self, ns: str, name: str, **status: Any) -> dict[str, Any]:
        """Write status through the status subresource, as the controller does (merge patch); for the CRD tests of
        the status subresource (test_cloudvm_crd.py), never in place of the controller.

        ``observedGeneration`` defaults to the object's current generation.
        """
        if "observedGeneration" not in status:
            obj = self.get(ns, name)
            assert obj is not None
            status["observedGeneration"] = obj["metadata"]["generation"]
        return dict(self.api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                                   {"status": status}))


def api_error(call: Callable[[], Any]) -> dict[str, Any]:
    """The Status body of the ApiException ``call`` raises (fails the test when it does not raise)."""
    with pytest.raises(ApiException) as err:
        call()
    body = json.loads(err.value.body)
    body["http_status"] = err.value.status
    return dict(body)


# --------------------------------------------------------------------------- ansible-playbook


@dataclass
class PlayRun:
    """One ansible-playbook run: exit code, raw output and each task's result (in task order)."""

    rc: int
    stdout: str
    stderr: str
    results: list[dict[str, Any]]


def run_play(tasks: list[dict[str, Any]], *, kubeconfig: Path | None, check: bool = False, diff: bool = False,
             verbosity: int = 0, json_output: bool = True, env: dict[str, str] | None = None,
             tmp_path: Path, background: bool = False) -> PlayRun | subprocess.Popen[str]:
    """Run ``tasks`` on localhost with ``ansible-playbook`` from the checkout (its ansible.cfg).

    The cloud's action group defaults to ``backend: kubernetes``; the kubeconfig goes in through the
    ``K8S_AUTH_KUBECONFIG`` fallback of kubernetes.core unless a task passes its own auth options.
    Every task gets ``ignore_errors: true`` so later tasks still run; the caller asserts per task.
    """
    tasks = [dict(t, ignore_errors=True) for t in tasks]
    playbook = [{"hosts": "localhost", "gather_facts": False,
                 "module_defaults": {"group/zjusct.cloud.cloud": {"backend": "kubernetes"}}, "tasks": tasks}]
    path = tmp_path / f"play-{time.monotonic_ns()}.yml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}", str(path)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    if verbosity:
        argv.append("-" + "v" * verbosity)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("K8S_AUTH_")}
    full_env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                    ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-tmp"))
    if json_output:
        full_env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    if kubeconfig is not None:
        full_env["K8S_AUTH_KUBECONFIG"] = str(kubeconfig)
    full_env.update(env or {})
    proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if background:
        return proc
    return finish_play(proc, json_output)


def finish_play(proc: subprocess.Popen[str], json_output: bool = True) -> PlayRun:
    """Wait for a play started with ``background=True`` and parse its results."""
    try:
        out, err = proc.communicate(timeout=PLAY_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        tail = f"{out[-3000:]}\n{err[-3000:]}"
        raise AssertionError(f"ansible-playbook timed out after {PLAY_TIMEOUT} s:\n{tail}") from None
    results: list[dict[str, Any]] = []
    if json_output:
        try:
            doc = json.loads(out[out.index("{"):])
        except ValueError as exc:
            raise AssertionError(f"no JSON from ansible-playbook (rc {proc.returncode}):\n{out}\n{err}") from exc
        for play in doc.get("plays", []):
            for task in play.get("tasks", []):
                results.append(task["hosts"].get("localhost", {}))
    return PlayRun(proc.returncode, out, err, results)


def cloudvm_task(**args: Any) -> dict[str, Any]:
    """One ``zjusct.cloud.cloudvm`` task."""
    return {"zjusct.cloud.cloudvm": args}




def owner_policy_enforced(tenant_api: Any) -> bool:
    """True once the API server enforces each policy of config/policy/owner-admission.yaml on the tenant (server-side
    dry runs in her namespace, nothing stored): a CloudVM for another owner, a claim with another owner's mark, a
    Pod with a launcher's mark and a ConfigMap made a CloudVM's dependent are refused, each by its policy (those
    of the policies the file holds).

    A new ValidatingAdmissionPolicy takes effect after the API server's policy informer has seen it
    and its binding (seconds), so fixtures wait on this rather than on the objects' existence.
    """
    probe = "policy-probe"
    core: Any = client.CoreV1Api(tenant_api)
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("cloudvm-owner.cloud.zjusct.io", lambda: client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            GROUP, VERSION, TENANT_NAMESPACE, PLURAL,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": probe},
             "spec": {"owner": "policy-probe-owner", "rootVolumeClaim": "policy-probe-root"}}, dry_run="All")),
        ("root-volume-claim.cloud.zjusct.io", lambda: core.create_namespaced_persistent_volume_claim(
            TENANT_NAMESPACE, {"metadata": {"name": probe, "labels": {"cloud.zjusct.io/owner": "policy-probe-owner"}},
                               "spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "1Gi"}}}}, dry_run="All")),
        ("launcher-pod.cloud.zjusct.io", lambda: core.create_namespaced_pod(
            TENANT_NAMESPACE, {"metadata": {"name": probe, "labels": {"cloud.zjusct.io/vm": probe}},
                               "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}},
            dry_run="All")),
        ("cloudvm-dependent.cloud.zjusct.io", lambda: core.create_namespaced_config_map(
            TENANT_NAMESPACE, {"metadata": {"name": probe, "ownerReferences": [
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "name": probe,
                 "uid": "00000000-0000-0000-0000-000000000000"}]}}, dry_run="All")),
    ]
    in_file = {d["metadata"]["name"] for d in load_docs(OWNER_POLICY) if d["kind"] == "ValidatingAdmissionPolicy"}
    for policy, attempt in attempts:
        if policy not in in_file:
            continue
        try:
            attempt()
        except ApiException as exc:
            if exc.status == 403 and policy in (exc.body or ""):
                continue
        return False
    return True
