"""The controller (controller/zjusct_controller, docs/controller.md) as a process for tests: :class:`Controller`
runs ``python -m zjusct_controller`` from this checkout, :func:`controller_kubeconfig` gives it the rights of
config/rbac/controller-role.yaml and nothing more.

Used on the shared control plane (tests/integration/cloudvm_k8s: launcher Pods are created but never run) and on
the real node (tests/integration/k8s_node: guests boot).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import FENCE_FINALIZER
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_ROLE = REPO / "config" / "rbac" / "controller-role.yaml"


class Controller:
    """``python -m zjusct_controller`` as a subprocess (log in ``log``); start/stop/restart.

    Args:
        kubeconfig: the controller's kubeconfig (see :func:`controller_kubeconfig`).
        cfg: the controller config file (JSON; docs/controller.md).
        namespace: the one namespace it watches (``--namespace``).
        log: its stdout and stderr are appended here.
        resync: ``--resync`` in seconds.
        extra_args: more command-line options (e.g. ``--leader-elect``).
    """

    def __init__(self, kubeconfig: Path, cfg: Path, namespace: str, log: Path, *, resync: int = 10,
                 extra_args: Sequence[str] = ()) -> None:
        with socket.socket() as s:  # a free port for /metrics
            s.bind(("127.0.0.1", 0))
            self.metrics_port = s.getsockname()[1]
        self.argv = [sys.executable, "-m", "zjusct_controller", "--config", str(cfg), "--kubeconfig",
                     str(kubeconfig), "--namespace", namespace, "--resync", str(resync),
                     "--metrics-port", str(self.metrics_port), *extra_args]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Controller:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "controller"), str(REPO / ".collections")]))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGKILL: no Lease release, no cleanup) and wait; killed after 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``/metrics``: (name, sorted labels) -> value."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
                for fam in text_string_to_metric_families(text) for smp in fam.samples}

    def reconciles(self) -> float:
        """``zjusct_controller_reconciles_total`` (0 before the first reconcile, e.g. a leader-election standby)."""
        return sum(v for (name, _), v in self.metrics().items() if name == "zjusct_controller_reconciles_total")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


def controller_kubeconfig(k8s_api: Any, admin_kubeconfig: Path, path: Path, namespace: str | None = None) -> Path:
    """A kubeconfig for the controller's ServiceAccount ``zjusct-cloud-system/cloudvm-controller`` bound to the
    ClusterRole of config/rbac/controller-role.yaml, so the tests run the controller with exactly the rights the
    role grants and as the identity the owner admission policies exempt (config/policy/owner-admission.yaml): a
    TokenRequest token, one hour.

    Args:
        namespace: None: the file's own Namespace, ServiceAccount and ClusterRoleBinding are created (what
            site.yml installs). Otherwise its Namespace and ServiceAccount are created when missing and bound by the
            ClusterRoleBinding ``<namespace>-cloudvm-controller`` (remove it with :func:`delete_binding`), so a
            shared control plane keeps no ClusterRoleBinding of site.yml's (its test expects to create it).
    """
    core: Any = client.CoreV1Api(k8s_api)
    rbac: Any = client.RbacAuthorizationV1Api(k8s_api)
    docs = [d for d in yaml.safe_load_all(CONTROLLER_ROLE.read_text()) if d]
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    if namespace is not None:
        binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
        binding = {**binding, "metadata": {"name": f"{namespace}-{sa['metadata']['name']}"}}
        docs = [d for d in docs if d["kind"] != "ClusterRoleBinding"] + [binding]
    create = {"Namespace": lambda d: core.create_namespace(d),
              "ServiceAccount": lambda d: core.create_namespaced_service_account(d["metadata"]["namespace"], d),
              "ClusterRole": lambda d: rbac.create_cluster_role(d),
              "ClusterRoleBinding": lambda d: rbac.create_cluster_role_binding(d)}
    replace = {"ClusterRole": lambda d: rbac.replace_cluster_role(d["metadata"]["name"], d)}
    for doc in docs:
        try:
            create[doc["kind"]](doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
            if doc["kind"] in replace:  # the role of this checkout, also when an earlier test created one
                replace[doc["kind"]](doc)
    token = wait_for(lambda: core.create_namespaced_service_account_token(
        sa["metadata"]["name"], sa["metadata"]["namespace"], {"spec": {"expirationSeconds": 3600}}).status.token,
        60, "ServiceAccount token")
    doc = yaml.safe_load(admin_kubeconfig.read_text())
    doc["users"] = [{"name": "controller", "user": {"token": token}}]
    doc["contexts"] = [{"name": "controller", "context": {"cluster": doc["clusters"][0]["name"], "user": "controller"}}]
    doc["current-context"] = "controller"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def delete_binding(k8s_api: Any, namespace: str) -> None:
    """Delete the ClusterRoleBinding :func:`controller_kubeconfig` made for ``namespace`` (gone already: fine)."""
    with contextlib.suppress(ApiException):
        client.RbacAuthorizationV1Api(k8s_api).delete_cluster_role_binding(f"{namespace}-cloudvm-controller")


def release_launcher_pods(core: Any, namespace: str) -> None:
    """Remove the controller's finalizer :data:`FENCE_FINALIZER` from every Pod of ``namespace`` that carries it, as
    an operator does by hand once no controller will (docs/controller.md, Fencing): a test's cleanup after its
    controller stopped, so that the launcher Pods it force-deleted go and stop holding their node's resources. A Pod
    gone or changed meanwhile is skipped."""
    with contextlib.suppress(ApiException):
        for pod in core.list_namespaced_pod(namespace).items:
            finalizers = list(pod.metadata.finalizers or [])
            if FENCE_FINALIZER not in finalizers:
                continue
            with contextlib.suppress(ApiException):
                core.patch_namespaced_pod(pod.metadata.name, namespace, [
                    {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "replace", "path": "/metadata/finalizers",
                     "value": [f for f in finalizers if f != FENCE_FINALIZER]}])
