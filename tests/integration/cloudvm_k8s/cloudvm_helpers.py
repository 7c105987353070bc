"""Helpers for the CloudVM tests against the real control plane: CloudVM access as kubectl would do
it, a stand-in controller thread, and ansible-playbook runs of the modules from this checkout.

``FakeController`` plays the controller for the module tests on the shared control plane (no real node, no
guest boot): a test that needs a phase transition gets it from this thread, which writes status through the
status subresource as the controller does. The real controller (controller/zjusct_controller) with the module
is tested on the real node in tests/integration/k8s_node/test_controller.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils._spec import GROUP, PLURAL, VERSION
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(os.environ.get("ZJUSCT_VENV", "/var/cache/zjusct-cloud/venv")) / "bin"
CRD_FILE = REPO / "config" / "crd" / "cloudvms.cloud.zjusct.io.yaml"
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
        """Write status through the status subresource, as the controller does (merge patch).

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


# --------------------------------------------------------------------------- the stand-in controller


@dataclass
class FakeController:
    """Plays the CloudVM controller for one VM from a background thread (status subresource writes).

    Modes:
        ``obedient``: a Running request goes Pending (Starting) then, after ``boot_s``, Running
        (SSHReady); a Stopped request goes Stopping then Stopped (StopRequested).
        ``stuck``: a Running request stays Pending (WaitingForSSH) forever.

    ``history`` records every (powerState, bootID) the controller saw, in order.
    """

    cvms: CloudVMs
    ns: str
    name: str
    mode: str = "obedient"
    boot_s: float = 0.5
    history: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> FakeController:
        self._thread = threading.Thread(target=self._run, name=f"fake-controller-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        pending_since: float | None = None
        while not self._stop.wait(0.2):
            try:
                obj = self.cvms.get(self.ns, self.name)
                if obj is None:
                    continue
                spec, status = obj["spec"], obj.get("status") or {}
                seen = (spec["powerState"], spec["bootID"])
                if not self.history or self.history[-1] != seen:
                    self.history.append(seen)
                gen = obj["metadata"]["generation"]
                if spec["powerState"] == "Running":
                    boot = spec["bootID"]
                    if status.get("bootID") != boot or status.get("phase") not in ("Pending", "Running"):
                        pending_since = time.monotonic()
                        self.cvms.set_status(self.ns, self.name, phase="Pending", reason="Starting", bootID=boot,
                                             message=f"boot {boot} requested", observedGeneration=gen)
                    elif status.get("phase") == "Pending" and self.mode == "stuck":
                        if status.get("reason") != "WaitingForSSH" or status.get("observedGeneration") != gen:
                            self.cvms.set_status(self.ns, self.name, phase="Pending", reason="WaitingForSSH",
                                                 bootID=boot, observedGeneration=gen,
                                                 message=f"boot {boot} started, waiting for the SSH banner")
                    elif status.get("phase") == "Pending" and time.monotonic() - (pending_since or 0) >= self.boot_s:
                        self.cvms.set_status(self.ns, self.name, phase="Running", reason="SSHReady", bootID=boot,
                                             message="guest answered SSH", observedGeneration=gen,
                                             sshEndpoint={"host": "10.200.0.2", "port": 22})
                    elif status.get("observedGeneration") != gen:
                        self.cvms.set_status(self.ns, self.name, observedGeneration=gen)
                else:
                    if status.get("phase") in ("Pending", "Running"):
                        self.cvms.set_status(self.ns, self.name, phase="Stopping", reason="StopRequested",
                                             message="stopping", observedGeneration=gen)
                    elif status.get("phase") != "Stopped" or status.get("observedGeneration") != gen:
                        self.cvms.set_status(self.ns, self.name, phase="Stopped", reason="StopRequested",
                                             message="stopped as requested", observedGeneration=gen,
                                             bootID=status.get("bootID", spec["bootID"]))
            except Exception as exc:  # keep playing; the test asserts on errors
                self.errors.append(repr(exc))


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
    """True once the API server refuses the tenant a CloudVM for another owner (server-side dry run).

    A new ValidatingAdmissionPolicy takes effect after the API server's policy informer has seen it
    and its binding (seconds), so fixtures wait on this rather than on the objects' existence.
    """
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": "policy-probe"},
            "spec": {"owner": "policy-probe-owner", "rootVolumeClaim": "policy-probe-root"}}
    try:
        client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            GROUP, VERSION, TENANT_NAMESPACE, PLURAL, body, dry_run="All")
    except ApiException as exc:
        return exc.status == 403 and "cloudvm-owner.cloud.zjusct.io" in (exc.body or "")
    return False
