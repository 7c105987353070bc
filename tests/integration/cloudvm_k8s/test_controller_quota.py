"""Quotas and refusals on Kubernetes, against the real kube-apiserver (its ResourceQuota, LimitRanger and
PodSecurity admission) with the real controller process (config/rbac/controller-role.yaml's rights, watching two
namespaces) and the real scheduler:

* a launcher Pod refused by a namespace ResourceQuota or LimitRange -> the CloudVM ``Blocked/QuotaExceeded`` with
  the API server's message and a Warning Event, no launcher Pod; the quota raised (the LimitRange removed) -> the
  Pod is created and, once the kubelet stand-in reports it running and ready, the VM is Running;
* one refused by Pod Security admission (the same kind of write) -> ``Blocked/Refused``, then Running once allowed;
* the per-owner CloudQuota (docs/security.md "Quotas on Kubernetes"): alice over her vCPUs across two namespaces
  is refused in the host's message shape while bob is not, and stopping her other VM lets it start; ``vms`` and
  ``diskMiB`` count from a VM's first admitted boot; several of her VMs created at once never get more launcher
  Pods than the quota allows;
* the ``cloudvm`` module's wait fails at once with the refusal; ``owner_quota`` with ``backend: kubernetes``.

The nodes of this control plane run no kubelet: ``Kubelet.mark_running`` (tests/cluster) writes a bound Pod's
status with the node's own identity, and the teardown confirms the controller's graceful deletions. Owners are
unique per test (CloudQuotas are cluster-scoped).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.cluster import Cluster, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import GROUP, PLURAL, VERSION, PlayRun, cloudvm_task
from tests.integration.controller_process import Controller, controller_kubeconfig, delete_binding

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]
LABEL_VM = "cloud.zjusct.io/vm"
NODE = "node-a"
QUOTAS = "cloudquotas"
WAIT_S = 180  # a status the controller writes after one reconcile; generous for a loaded machine


@dataclass
class Env:
    cluster: Cluster
    core: Any
    custom: Any
    ns: str
    ns2: str
    controller: Controller
    alice: str
    bob: str
    quotas: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ objects

    def claim(self, ns: str, name: str, size: str = "1Gi") -> None:
        """A Bound root volume claim ``<name>-root`` of ``size`` (a hostPath PV, never mounted)."""
        pv = f"{ns}-{name}-root"
        self.core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": "/nonexistent", "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": ns, "name": f"{name}-root"}}})
        self.core.create_namespaced_persistent_volume_claim(ns, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{name}-root"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": size}}}})
        wait_for(lambda: self.core.read_namespaced_persistent_volume_claim(f"{name}-root", ns).status.phase
                 == "Bound", 120, f"{ns}/{name}-root Bound")

    def vm(self, ns: str, name: str, owner: str, vcpus: int = 1, claim: bool = True) -> None:
        """A CloudVM asking to run (boot 1), with its claim unless ``claim`` is False (made beforehand)."""
        if claim:
            self.claim(ns, name)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": name},
            "spec": {"owner": owner, "rootVolumeClaim": f"{name}-root", "vcpus": vcpus, "memoryMiB": 512,
                     "powerState": "Running", "bootID": 1}})

    def quota(self, owner: str, **spec: int) -> None:
        """Create or replace ``owner``'s CloudQuota (removed at teardown)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudQuota", "metadata": {"name": owner}, "spec": spec}
        if owner not in self.quotas:
            self.quotas.append(owner)
            self.custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, body)
            return
        cur = self.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, owner)
        body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        self.custom.replace_cluster_custom_object(GROUP, VERSION, QUOTAS, owner, body)

    def power(self, ns: str, name: str, state: str) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": {"powerState": state}})

    # ------------------------------------------------------------------ observations

    def get(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))

    def status_when(self, ns: str, name: str, phase: str, reason: str, timeout: float = WAIT_S) -> dict[str, Any]:
        """Wait until the CloudVM's status is ``phase``/``reason`` for its current generation; on timeout say
        what was seen last and show the controller's log."""
        seen: list[Any] = [None]

        def check() -> dict[str, Any] | None:
            obj = self.get(ns, name)
            st = obj.get("status") or {}
            seen[0] = {k: st.get(k) for k in ("phase", "reason", "message", "bootID", "observedGeneration")}
            if (st.get("phase"), st.get("reason")) == (phase, reason) and st.get("observedGeneration") == \
                    obj["metadata"]["generation"]:
                return dict(st)
            return None
        try:
            return dict(wait_for(check, timeout, f"{ns}/{name}: {phase}/{reason}", interval=0.5))
        except TimeoutError as exc:
            print(self.controller.tail())
            raise AssertionError(f"{ns}/{name}: not {phase}/{reason} after {timeout} s; last status {seen[0]}") \
                from exc

    def pods(self, ns: str, name: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(ns, label_selector=f"{LABEL_VM}={name}").items)

    def run(self, ns: str, name: str) -> dict[str, Any]:
        """The VM's launcher Pod once it exists and is bound to :data:`NODE`, reported running and ready by the
        kubelet stand-in; returns the status once the controller says Running."""
        def bound() -> Any:
            pods = [p for p in self.pods(ns, name) if p.spec.node_name == NODE]
            return pods[0] if pods else None
        pod = wait_for(bound, WAIT_S, f"{ns}/{name}: launcher Pod bound to {NODE}", interval=0.5)
        self.cluster.kubelet(NODE).mark_running(ns, pod.metadata.name)
        return self.status_when(ns, name, "Running", "SSHReady")

    def warning(self, ns: str, name: str, reason: str) -> Any:
        """The Warning Event of ``reason`` on the CloudVM (waits for it)."""
        def found() -> Any:
            events = self.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            return next((e for e in events if e.type == "Warning" and e.reason == reason
                         and e.involved_object.kind == "CloudVM"), None)
        return wait_for(found, 60, f"{ns}/{name}: Warning Event {reason}", interval=0.5)

    def confirm_deletion(self, ns: str, name: str) -> None:
        """The controller deletes the VM's launcher Pods gracefully; no kubelet confirms it: the test does."""
        wait_for(lambda: all(p.metadata.deletion_timestamp for p in self.pods(ns, name)), WAIT_S,
                 f"{ns}/{name}: launcher Pods being deleted by the controller", interval=0.5)
        for p in self.pods(ns, name):
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)


@pytest.fixture
def env(k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, cloudvm_crd: Any, tmp_path: Path) -> Iterator[Env]:
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    ns2 = f"{k8s_namespace}-b"
    core.create_namespace({"metadata": {"name": ns2, "labels": {"cloud.zjusct.io/test": "true"}}})
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
                               "cmdline": "console=ttyS0", "nodeSelector": {"kubernetes.io/hostname": NODE}}))
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig",
                                       namespace=k8s_namespace)
    ctl = Controller(kubeconfig, cfg, k8s_namespace, tmp_path / "controller.log", resync=5,
                     extra_args=["--namespace", ns2]).start()
    tag = uuid.uuid4().hex[:6]
    e = Env(k8s_cluster, core, custom, k8s_namespace, ns2, ctl, f"alice-{tag}", f"bob-{tag}")
    try:
        wait_for(ctl.metrics, 60, "controller serves /metrics")
        yield e
    finally:
        for ns in (k8s_namespace, ns2):
            with contextlib.suppress(ApiException):
                custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)

        def gone() -> bool:  # no kubelet: confirm the controller's graceful deletions, as it would
            for ns in (k8s_namespace, ns2):
                core.delete_collection_namespaced_pod(ns, label_selector=LABEL_VM, grace_period_seconds=0)
            return not any(custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                           for ns in (k8s_namespace, ns2))
        with contextlib.suppress(ApiException, TimeoutError):
            wait_for(gone, 90, "CloudVMs deleted", interval=1)
        ctl.stop()
        print(ctl.tail()[-4000:])
        delete_binding(k8s_api, k8s_namespace)
        for owner in e.quotas:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, owner)
        for pv in core.list_persistent_volume().items:
            if pv.metadata.name.startswith((f"{k8s_namespace}-", f"{ns2}-")):
                with contextlib.suppress(ApiException):
                    core.delete_persistent_volume(pv.metadata.name)
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(ns2, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns2)


# --------------------------------------------------------------------------- namespace ResourceQuota, LimitRange


def test_a_launcher_pod_refused_by_a_resource_quota_is_quota_exceeded_until_the_quota_is_raised(env: Env) -> None:
    env.core.create_namespaced_resource_quota(env.ns, {"metadata": {"name": "tiny"},
                                                        "spec": {"hard": {"requests.cpu": "100m"}}})
    env.vm(env.ns, "web", env.alice)
    st = env.status_when(env.ns, "web", "Blocked", "QuotaExceeded")
    assert st["message"].startswith(f"the API server refused the launcher Pod {env.ns}/web-boot-1 (HTTP 403): ")
    assert "exceeded quota: tiny, requested: requests.cpu=350m" in st["message"], st
    assert "pod" not in st and st["conditions"][0]["reason"] == "QuotaExceeded"
    event = env.warning(env.ns, "web", "QuotaExceeded")
    assert "exceeded quota: tiny" in event.message
    assert env.pods(env.ns, "web") == []
    env.core.patch_namespaced_resource_quota("tiny", env.ns, {"spec": {"hard": {"requests.cpu": "2"}}})
    running = env.run(env.ns, "web")  # the quota's change is watched: the boot is retried at once
    assert running["pod"] == "web-boot-1" and running["admittedBootID"] == 1
    assert len(env.pods(env.ns, "web")) == 1


def test_a_launcher_pod_refused_by_a_limit_range_is_quota_exceeded_until_it_allows(env: Env) -> None:
    env.core.create_namespaced_limit_range(env.ns, {"metadata": {"name": "big-only"}, "spec": {"limits": [
        {"type": "Container", "min": {"memory": "1Gi"}}]}})
    env.vm(env.ns, "web", env.alice)
    st = env.status_when(env.ns, "web", "Blocked", "QuotaExceeded")
    assert "minimum memory usage per Container is 1Gi, but request is 534Mi" in st["message"], st
    assert "minimum memory usage per Container" in env.warning(env.ns, "web", "QuotaExceeded").message
    assert env.pods(env.ns, "web") == []
    env.core.delete_namespaced_limit_range("big-only", env.ns)
    env.run(env.ns, "web")


def test_a_launcher_pod_refused_by_pod_security_is_blocked_refused_until_the_namespace_allows_it(env: Env) -> None:
    env.core.patch_namespace(env.ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    env.vm(env.ns, "web", env.alice)
    st = env.status_when(env.ns, "web", "Blocked", "Refused")
    assert 'violates PodSecurity "restricted' in st["message"] and "web-boot-1 (HTTP 403)" in st["message"], st
    assert "violates PodSecurity" in env.warning(env.ns, "web", "Refused").message
    env.core.patch_namespace(env.ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    env.run(env.ns, "web")  # retried with backoff (no namespace watch): at most a minute


# --------------------------------------------------------------------------- the owner's CloudQuota


def test_alice_over_her_vcpus_across_two_namespaces_waits_for_her_other_vm_and_bob_is_unaffected(env: Env) -> None:
    alice, bob = env.alice, env.bob
    env.quota(alice, vcpus=2)
    env.vm(env.ns, "one", alice, vcpus=2)
    env.run(env.ns, "one")
    env.vm(env.ns2, "two", alice, vcpus=1)
    st = env.status_when(env.ns2, "two", "Blocked", "QuotaExceeded")
    assert st["message"] == (
        f"vcpus: owner '{alice}' would use 3 of quota 2 vCPUs (in use 2, this request 1, asked by vcpus, spec.vcpus"
        f" of CloudVM {env.ns2}/two); stop another VM of '{alice}', or ask the operator to raise owner_quota vcpus")
    assert "admittedBootID" not in st and "pod" not in st
    assert st["message"] in env.warning(env.ns2, "two", "QuotaExceeded").message
    assert env.pods(env.ns2, "two") == []
    claim = env.core.read_namespaced_persistent_volume_claim("two-root", env.ns2)
    assert "cloud.zjusct.io/claimed-by" not in (claim.metadata.annotations or {})  # nothing marked
    env.vm(env.ns2, "bobs", bob, vcpus=4)  # bob has no CloudQuota; alice's does not count him
    env.run(env.ns2, "bobs")
    env.power(env.ns, "one", "Stopped")  # alice's other VM stopped: its vCPUs are free
    env.run(env.ns2, "two")
    env.confirm_deletion(env.ns, "one")
    assert env.status_when(env.ns, "one", "Stopped", "StopRequested")["admittedBootID"] == 1


def test_vms_and_disk_count_from_the_first_admitted_boot_until_the_vm_is_deleted(env: Env) -> None:
    alice = env.alice
    env.quota(alice, vms=2, diskMiB=1536)
    env.vm(env.ns, "one", alice)
    env.run(env.ns, "one")
    env.power(env.ns, "one", "Stopped")  # a stopped VM keeps its VM and its disk
    env.confirm_deletion(env.ns, "one")
    env.status_when(env.ns, "one", "Stopped", "StopRequested")
    env.vm(env.ns2, "two", alice)
    st = env.status_when(env.ns2, "two", "Blocked", "QuotaExceeded")
    assert st["message"].startswith(
        f"disk_mib: owner '{alice}' would use 2048 of quota 1536 MiB of disk (in use 1024, this request 1024, asked by"
        f" volume_size_mib, spec.rootVolumeClaim two-root of CloudVM {env.ns2}/two)"), st
    env.quota(alice, vms=2, diskMiB=4096)  # the operator raises it: the waiting boot is admitted
    env.run(env.ns2, "two")
    env.vm(env.ns2, "three", alice)
    st = env.status_when(env.ns2, "three", "Blocked", "QuotaExceeded")
    assert st["message"].startswith(f"vms: owner '{alice}' would use 3 of quota 2 VMs (in use 2, this request 1, "
                                    f"asked by name, metadata.name of CloudVM {env.ns2}/three)"), st
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, "one")  # frees a VM and its disk
    wait_for(lambda: not env.custom.list_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL)["items"], WAIT_S,
             f"{env.ns}/one deleted")
    env.run(env.ns2, "three")


def test_several_boots_of_one_owner_at_once_never_get_more_launcher_pods_than_her_quota(env: Env) -> None:
    alice = env.alice
    env.quota(alice, vcpus=2)
    names = [(env.ns if i % 2 else env.ns2, f"vm{i}") for i in range(6)]
    for ns, name in names:
        env.claim(ns, name)
    seen: dict[str, set[str]] = {"alive": set()}
    most = [0]
    stop = threading.Event()

    def watch_pods(ns: str) -> None:  # every launcher Pod of these namespaces, from the API server's own stream
        version: dict[str, str] = {}
        while not stop.is_set():  # short watches, each resumed where the last one ended: no event is missed
            try:
                for ev in watch.Watch().stream(env.core.list_namespaced_pod, ns, label_selector=LABEL_VM,
                                               timeout_seconds=5, **version):
                    version = {"resource_version": ev["object"].metadata.resource_version}
                    key = f"{ns}/{ev['object'].metadata.name}"
                    (seen["alive"].discard if ev["type"] == "DELETED" else seen["alive"].add)(key)
                    most[0] = max(most[0], len(seen["alive"]))
            except Exception as exc:  # a stream cut short (a loaded API server): resumed by the next watch
                seen.setdefault("errors", set()).add(type(exc).__name__)

    watchers = [threading.Thread(target=watch_pods, args=(ns,), daemon=True) for ns in (env.ns, env.ns2)]
    for t in watchers:
        t.start()
    time.sleep(1)
    makers = [threading.Thread(target=env.vm, args=(ns, name, alice), kwargs={"claim": False})
              for ns, name in names]
    for t in makers:
        t.start()
    for t in makers:
        t.join(60)

    def settled() -> list[str] | None:
        reasons = sorted(((env.get(ns, n).get("status") or {}).get("reason") or "-") for ns, n in names)
        return reasons if reasons == ["QuotaExceeded"] * 4 + ["Starting"] * 2 else None
    try:
        wait_for(settled, WAIT_S, "2 VMs starting and 4 QuotaExceeded", interval=1)
    except TimeoutError as exc:
        print(env.controller.tail())
        last = [(n, (env.get(ns, n).get("status") or {}).get("reason")) for ns, n in names]
        raise AssertionError(f"not 2 Starting and 4 QuotaExceeded after {WAIT_S} s; last {last}") from exc
    time.sleep(10)  # retries and resyncs come and go: still two
    stop.set()
    for t in watchers:
        t.join(30)
    pods = [p for ns, n in names for p in env.pods(ns, n)]
    assert len(pods) == 2 and most[0] == 2, (sorted(seen["alive"]), most)


# --------------------------------------------------------------------------- the modules


def test_the_cloudvm_module_fails_at_once_with_the_quota_refusal_and_owner_quota_lets_it_start(
        env: Env, play: Callable[..., PlayRun]) -> None:
    alice = env.alice
    env.claim(env.ns, "web")
    run = play([{"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": 1}},
                cloudvm_task(name="web", namespace=env.ns, owner=alice, vcpus=2, power_state="running",
                             wait_timeout=600)])
    env.quotas.append(alice)
    quota, start = run.results
    assert quota.get("changed") is True and not quota.get("failed"), quota
    assert start.get("failed") is True, start
    assert start["reason"] == "QuotaExceeded" and (start["quota"], start["limit"], start["in_use"],
                                                   start["requested"]) == ("vcpus", 1, 0, 2), start
    assert f"CloudVM {env.ns}/web: boot 1 refused (QuotaExceeded): vcpus: owner '{alice}' would use 2 of quota 1" \
        in start["msg"] and "timed out" not in start["msg"], start["msg"]
    assert start["changed"] is True  # the CloudVM was written: it waits for its quota
    run = play([{"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": 2}}])
    assert run.results[0].get("changed") is True
    env.run(env.ns, "web")


def test_owner_quota_on_kubernetes_is_changed_once_and_check_mode_writes_nothing(
        env: Env, play: Callable[..., PlayRun]) -> None:
    alice = env.alice
    env.quotas.append(alice)  # removed at teardown whatever happens
    task = {"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": 4, "memory_mib": 4096}}

    def stored() -> dict[str, Any] | None:
        try:
            return dict(env.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, alice)["spec"])
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    predicted = play([task], check=True, diff=True).results[0]
    assert predicted.get("changed") is True and not predicted.get("failed"), predicted
    assert predicted["diff"]["after"]["vcpus"] == 4 and stored() is None  # a dry run on the API server
    first, second, bad = play([task, task, {"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": -1}}]).results
    assert (first.get("changed"), second.get("changed")) == (True, False), (first, second)
    assert stored() == {"vcpus": 4, "memoryMiB": 4096}
    assert second["quota"] == {"vms": None, "vcpus": 4, "memory_mib": 4096, "disk_mib": None, "bandwidth_mbps": None}
    assert second["usage"] == {"vms": 0, "vcpus": 0, "memory_mib": 0, "disk_mib": 0, "bandwidth_mbps": 0}
    assert bad.get("failed") is True and "vcpus: -1 is not an integer >= 0" in bad["msg"] \
        and "CloudQuota spec.vcpus" in bad["msg"], bad
    lower = play([{"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": 2}}], check=True).results[0]
    assert lower.get("changed") is True and stored() == {"vcpus": 4, "memoryMiB": 4096}
    tenant = play([{"zjusct.cloud.owner_quota": {"owner": alice, "vcpus": 64}}], user="alice").results[0]
    assert tenant.get("failed") is True and "forbidden" in tenant["msg"].lower(), tenant  # only operators write it
    assert stored() == {"vcpus": 4, "memoryMiB": 4096}
    gone = play([{"zjusct.cloud.owner_quota": {"owner": alice, "state": "absent"}}] * 2).results
    assert [r.get("changed") for r in gone] == [True, False] and stored() is None
