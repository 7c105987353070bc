"""The one CloudVM lifecycle (cloudvm/lifecycle.py) over an in-memory fake of the CloudVM API port, shaped like
kube-apiserver with a controller in the background.

The fake keeps resourceVersion/generation like the API server, refuses stale writes with a 409
and applies the same rules as the CRD (through ``model.spec``), so the retry, idempotency and wait
logic can be proved exhaustively here; tests/integration/cloudvm_k8s/ proves the same against the
real API server, tests/integration/cloudvm_k8s/test_lifecycle_backends.py over both real adapters.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm import lifecycle as lc
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.port import Conflict, RootVolume
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import cloudvm as k8s
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    validate_spec,
    validate_update,
    with_defaults,
)


class FakeApi:
    """A CloudVM store with optimistic concurrency, defaults and validation like the real server."""

    backend = "kubernetes"
    reconciles_in_background = True
    ignored_options = {"image": "host backend only"}
    ssh_gateway = False
    launched_boot = k8s.KubernetesCloudVMApi.launched_boot  # a pure read of the status, as the adapter's
    # the adapter's check of a Running status against its launcher Pod, over the Pods of ``_core`` (a FakeCore);
    # None: no Pod is read and nothing is doubted, as an adapter that cannot read Pods
    running_doubt = k8s.KubernetesCloudVMApi.running_doubt
    # and of the node its status names (the operator's out-of-service taint), over the Nodes of ``_core``
    boot_node_out_of_service = k8s.KubernetesCloudVMApi.boot_node_out_of_service
    _core_read = k8s.KubernetesCloudVMApi._core_read
    _core: Any = None

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.rv = 0
        self.writes = 0
        self.before_write: Optional[Callable[[], None]] = None  # runs between a GET and the next write
        self.kept_volumes: dict[str, str] = {}  # root volumes a delete kept -> owner

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get(self, namespace: str, name: str) -> Optional[dict]:
        obj = self.objects.get((namespace, name))
        return copy.deepcopy(obj) if obj else None

    def _check(self, spec: dict, old: Optional[dict]) -> dict:
        spec = with_defaults(spec)
        errors = validate_spec(spec) + (validate_update(old, spec) if old else [])
        if errors:
            raise CloudVMError("invalid: " + "; ".join(errors), api_status=422, api_reason="Invalid")
        return spec

    def _hook(self) -> None:
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()

    def create(self, body: dict, dry_run: bool, root_volume: Optional[RootVolume] = None) -> dict:
        self._hook()
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.objects:
            raise Conflict("AlreadyExists")
        obj = copy.deepcopy(body)
        obj["spec"] = self._check(obj["spec"], None)
        obj["metadata"].update(resourceVersion=self._next_rv(), generation=1, uid="u-1")
        if not dry_run:
            self.objects[key] = obj
            self.writes += 1
        return copy.deepcopy(obj)

    def replace(self, body: dict, dry_run: bool) -> dict:
        self._hook()
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        cur = self.objects.get(key)
        if cur is None:
            raise CloudVMError("not found", api_status=404, api_reason="NotFound")
        if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise Conflict("Conflict")
        new = copy.deepcopy(cur)
        new["spec"] = self._check(body["spec"], cur["spec"])
        new["metadata"]["labels"] = dict(body["metadata"].get("labels") or {})
        if new == cur:
            return copy.deepcopy(cur)
        if new["spec"] != cur["spec"]:
            new["metadata"]["generation"] += 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        if not dry_run:
            self.objects[key] = new
            self.writes += 1
        return copy.deepcopy(new)

    def delete(self, namespace: str, name: str, dry_run: bool, delete_volume: bool = False) -> None:
        if not dry_run:
            gone = self.objects.pop((namespace, name), None)
            if gone is not None and not delete_volume:
                self.kept_volumes[f"{name}-root"] = gone["spec"]["owner"]

    def delete_kept_volume(self, namespace: str, name: str, owner: str, operator: bool,
                           dry_run: bool) -> Optional[str]:
        claim = f"{name}-root"
        if claim not in self.kept_volumes:
            return None
        if self.kept_volumes[claim] != owner and not operator:
            raise CloudVMError(f"delete_volume: volume {claim!r} belongs to owner {self.kept_volumes[claim]!r}")
        if not dry_run:
            del self.kept_volumes[claim]
        return claim

    def list(self, namespace: Optional[str], name: Optional[str], owner: Optional[str],
             label_selector: str) -> list[dict]:
        out = []
        for (ns, _), obj in self.objects.items():
            if namespace and ns != namespace:
                continue
            if owner and obj["spec"]["owner"] != owner:
                continue
            if name and obj["metadata"]["name"] != name:
                continue
            out.append(copy.deepcopy(obj))
        return out

    clock: Optional[Clock] = None

    def pause(self, namespace: str, name: str, seconds: float) -> None:
        assert self.clock is not None, "a wait needs the test's clock"
        self.clock.sleep(min(lc.POLL_INTERVAL, seconds))

    def ask_access(self, vm: dict, access: Any) -> None:
        pass

    def record_refusal(self, vm: dict, access: Any, error: Any) -> None:
        pass

    # what the controller does -------------------------------------------------------------
    def set_status(self, namespace: str, name: str, **status: Any) -> None:
        obj = self.objects[(namespace, name)]
        status.setdefault("observedGeneration", obj["metadata"]["generation"])
        obj["status"] = status
        obj["metadata"]["resourceVersion"] = self._next_rv()


class Clock:
    """Fake time: sleep advances it and gives a controller stand-in a chance to act."""

    def __init__(self, on_sleep: Optional[Callable[[], None]] = None) -> None:
        self.now = 0.0
        self.on_sleep = on_sleep

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep:
            self.on_sleep()

    def monotonic(self) -> float:
        return self.now


def params(**kw: Any) -> dict:
    base = {"state": "present", "name": "vm1", "namespace": "ns", "owner": "alice", "root_volume_claim": None,
            "vcpus": None, "memory_mib": None, "power_state": None, "restart": False, "ssh_authorized_keys": None,
            "bandwidth": None, "labels": None, "node_selector": None, "image": None, "volume_size_mib": None,
            "wait": False, "wait_timeout": 30}
    base.update(kw)
    return base


def obedient_controller(api: FakeApi, ns: str = "ns", name: str = "vm1") -> Callable[[], None]:
    """Reach what the spec asks for at once (a controller whose VMs boot instantly)."""

    def act() -> None:
        obj = api.objects.get((ns, name))
        if obj is None:
            return
        spec = obj["spec"]
        if spec["powerState"] == "Running":
            api.set_status(ns, name, phase="Running", reason="SSHReady", bootID=spec["bootID"],
                           pod=f"{name}-boot-{spec['bootID']}")
        else:
            prev = obj.get("status") or {}
            api.set_status(ns, name, phase="Stopped", reason="StopRequested",
                           bootID=prev.get("bootID", spec["bootID"]), **({"pod": prev["pod"]} if "pod" in prev else {}))

    return act


def backend(api: FakeApi, clock: Optional[Clock] = None) -> lc.Lifecycle:
    api.clock = clock or Clock()
    return lc.Lifecycle(api, monotonic=api.clock.monotonic)


def test_create_fills_defaults_and_second_run_changes_nothing() -> None:
    api = FakeApi()
    first = backend(api).ensure(params(), check_mode=False, diff=False)
    assert first["changed"] is True
    assert first["cloudvm"]["spec"] == {"owner": "alice", "rootVolumeClaim": "vm1-root", "vcpus": 1,
                                        "memoryMiB": 512, "powerState": "Stopped", "bootID": 0}
    second = backend(api).ensure(params(), check_mode=False, diff=False)
    assert second["changed"] is False
    assert api.writes == 1


def test_check_mode_predicts_create_and_stores_nothing() -> None:
    api = FakeApi()
    result = backend(api).ensure(params(power_state="running", wait=True), check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["diff"]["before"] == {}
    assert result["diff"]["after"]["bootID"] == 1
    assert api.objects == {}


def test_diff_shows_spec_before_and_after() -> None:
    api = FakeApi()
    backend(api).ensure(params(), check_mode=False, diff=False)
    result = backend(api).ensure(params(vcpus=2), check_mode=False, diff=True)
    assert result["diff"]["before"]["vcpus"] == 1
    assert result["diff"]["after"]["vcpus"] == 2


def test_update_without_owner_keeps_owner_but_create_without_owner_fails() -> None:
    api = FakeApi()
    with pytest.raises(CloudVMError, match="owner is required"):
        backend(api).ensure(params(owner=None), check_mode=False, diff=False)
    backend(api).ensure(params(), check_mode=False, diff=False)
    result = backend(api).ensure(params(owner=None, memory_mib=1024), check_mode=False, diff=False)
    assert result["cloudvm"]["spec"]["owner"] == "alice"
    assert result["cloudvm"]["spec"]["memoryMiB"] == 1024


def test_labels_are_merged_and_label_change_alone_is_a_change() -> None:
    api = FakeApi()
    backend(api).ensure(params(labels={"a": "1"}), check_mode=False, diff=False)
    result = backend(api).ensure(params(labels={"b": 2}), check_mode=False, diff=False)
    assert result["changed"] is True
    assert result["cloudvm"]["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert backend(api).ensure(params(labels={"b": "2"}), check_mode=False, diff=False)["changed"] is False


def test_start_never_started_vm_requests_boot_1_and_waits_running() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    result = backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    assert (result["changed"], result["boot_id"], result["phase"]) == (True, 1, "Running")


def test_start_on_running_vm_changes_nothing() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    again = backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    assert (again["changed"], again["boot_id"]) == (False, 1)


def test_start_after_guest_shutdown_bumps_boot_id_once_even_when_retried() -> None:
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    api.set_status("ns", "vm1", phase="Stopped", reason="GuestShutdown", bootID=1)
    first = backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    retry = backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    assert (first["changed"], first["boot_id"]) == (True, 2)
    assert (retry["changed"], retry["boot_id"]) == (False, 2)


def test_concurrent_start_between_get_and_put_is_replanned_not_doubled() -> None:
    """Another run writes the same start between our GET and PUT: our PUT gets 409, we re-plan, see the
    boot already requested, and write nothing more."""
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    api.set_status("ns", "vm1", phase="Stopped", reason="GuestShutdown", bootID=1)
    api.before_write = lambda: backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    result = backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    assert api.objects[("ns", "vm1")]["spec"]["bootID"] == 2
    assert (result["changed"], result["boot_id"]) == (False, 2)


def test_restart_stops_waits_stopped_then_starts_with_next_boot() -> None:
    api = FakeApi()
    seen: list[tuple[str, int]] = []
    controller = obedient_controller(api)

    def watch() -> None:
        controller()
        spec = api.objects[("ns", "vm1")]["spec"]
        seen.append((spec["powerState"], spec["bootID"]))

    clock = Clock(watch)
    backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    result = backend(api, clock).ensure(params(restart=True, wait=True), check_mode=False, diff=False)
    assert (result["changed"], result["boot_id"], result["phase"]) == (True, 2, "Running")
    assert ("Stopped", 1) in seen
    assert seen.index(("Stopped", 1)) < seen.index(("Running", 2))


def test_restart_in_check_mode_predicts_next_boot_and_writes_nothing() -> None:
    api = FakeApi()
    backend(api, Clock(obedient_controller(api))).ensure(params(power_state="running", wait=True),
                                                         check_mode=False, diff=False)
    writes = api.writes
    result = backend(api).ensure(params(restart=True), check_mode=True, diff=True)
    assert (result["changed"], result["boot_id"]) == (True, 2)
    assert result["diff"]["before"]["bootID"] == 1
    assert api.writes == writes


OLD_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld0000000000000000000000000000000000000000 old"
NEW_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew0000000000000000000000000000000000000000 new"


def test_rekeying_a_running_vm_says_the_keys_take_effect_at_the_next_boot() -> None:
    """The launcher Pod of boot 1 keeps the keys it was made with: the result names boot 2 and warns; a restart
    then boots 2 with them and warns of nothing."""
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True, ssh_authorized_keys=[OLD_KEY]),
                               check_mode=False, diff=False)
    rekeyed = backend(api, clock).ensure(params(power_state="running", wait=True, ssh_authorized_keys=[NEW_KEY]),
                                         check_mode=False, diff=False)
    assert (rekeyed["changed"], rekeyed["boot_id"], rekeyed["ssh_authorized_keys_boot_id"]) == (True, 1, 2)
    (warning,) = rekeyed["warnings"]
    assert warning.startswith("spec.sshAuthorizedKeys change takes effect at the next boot (bootID 2): boot 1 keeps"
                              " its keys in the guest until it ends")
    restarted = backend(api, clock).ensure(params(restart=True, wait=True, ssh_authorized_keys=[OLD_KEY]),
                                           check_mode=False, diff=False)
    assert (restarted["boot_id"], restarted["ssh_authorized_keys_boot_id"]) == (2, 2)
    assert "warnings" not in restarted
    unchanged = backend(api, clock).ensure(params(power_state="running", wait=True, ssh_authorized_keys=[OLD_KEY]),
                                           check_mode=False, diff=False)
    assert "ssh_authorized_keys_boot_id" not in unchanged and "warnings" not in unchanged


def test_resizing_a_running_vm_says_the_size_takes_effect_at_the_next_boot_and_a_stopped_one_says_nothing() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    checked = backend(api, clock).ensure(params(vcpus=2, memory_mib=1024), check_mode=True, diff=False)
    assert checked["warnings"] == ["spec.vcpus 1 -> 2 and spec.memoryMiB 512 -> 1024: takes effect at the next boot"
                                   " (bootID 2); boot 1 keeps its size until it ends; restart the VM (restart: true,"
                                   " playbook vm_restart) to apply it now"]
    resized = backend(api, clock).ensure(params(vcpus=2), check_mode=False, diff=False)
    assert resized["changed"] is True and resized["warnings"] == [
        "spec.vcpus 1 -> 2: takes effect at the next boot (bootID 2); boot 1 keeps its size until it ends; restart"
        " the VM (restart: true, playbook vm_restart) to apply it now"]
    restarted = backend(api, clock).ensure(params(restart=True, wait=True), check_mode=False, diff=False)
    assert restarted["boot_id"] == 2 and "warnings" not in restarted
    backend(api, clock).ensure(params(power_state="stopped", wait=True), check_mode=False, diff=False)
    stopped = backend(api, clock).ensure(params(memory_mib=1024), check_mode=False, diff=False)
    assert stopped["changed"] is True and "warnings" not in stopped
    assert api.objects[("ns", "vm1")]["spec"]["memoryMiB"] == 1024


def test_disk_io_limits_are_written_replaced_removed_and_a_running_vm_is_told_they_wait_for_its_next_boot() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    limited = backend(api, clock).ensure(params(disk_io={"write_bytes_per_second": 4194304, "read_iops": None}),
                                         check_mode=False, diff=False)
    assert api.objects[("ns", "vm1")]["spec"]["diskIO"] == {"writeBytesPerSecond": 4194304}
    assert limited["warnings"] == [
        "spec.diskIO none -> {writeBytesPerSecond: 4194304}: takes effect at the next boot (bootID 2); boot 1 keeps"
        " its disk I/O limits until it ends; restart the VM (restart: true, playbook vm_restart) to apply it now"]
    again = backend(api, clock).ensure(params(disk_io={"write_bytes_per_second": 4194304}), check_mode=False,
                                       diff=False)
    assert again["changed"] is False
    both = backend(api, clock).ensure(params(vcpus=2, disk_io={"read_iops": 500}), check_mode=True, diff=False)
    assert both["warnings"][0].startswith("spec.vcpus 1 -> 2 and spec.diskIO {writeBytesPerSecond: 4194304} ->"
                                          " {writeBytesPerSecond: 4194304, readIOPS: 500}: takes effect")  # kept
    assert "keeps its size and disk I/O limits until it ends" in both["warnings"][0]
    nothing = backend(api, clock).ensure(params(disk_io={}), check_mode=False, diff=False)
    assert nothing["changed"] is False
    one_less = backend(api, clock).ensure(params(disk_io={"write_bytes_per_second": 0, "read_iops": 500}),
                                          check_mode=False, diff=False)
    assert one_less["changed"] is True and api.objects[("ns", "vm1")]["spec"]["diskIO"] == {"readIOPS": 500}
    with pytest.raises(CloudVMError, match=r"spec.diskIO.readIOPS: False is not an integer"):  # never a 0
        backend(api, clock).ensure(params(disk_io={"read_iops": False}), check_mode=False, diff=False)
    removed = backend(api, clock).ensure(params(disk_io={"read_iops": 0}), check_mode=False, diff=False)
    assert removed["changed"] is True and "diskIO" not in api.objects[("ns", "vm1")]["spec"]


def test_rekeying_in_check_mode_predicts_the_same_and_a_checked_restart_warns_of_nothing() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True, ssh_authorized_keys=[OLD_KEY]),
                               check_mode=False, diff=False)
    writes = api.writes
    checked = backend(api, clock).ensure(params(ssh_authorized_keys=[NEW_KEY]), check_mode=True, diff=False)
    assert (checked["changed"], checked["ssh_authorized_keys_boot_id"]) == (True, 2)
    (warning,) = checked["warnings"]
    assert warning.startswith("spec.sshAuthorizedKeys change takes effect at the next boot (bootID 2): boot 1")
    restart = backend(api, clock).ensure(params(restart=True, ssh_authorized_keys=[NEW_KEY]), check_mode=True,
                                         diff=False)
    assert (restart["boot_id"], restart["ssh_authorized_keys_boot_id"]) == (2, 2) and "warnings" not in restart
    assert api.writes == writes


def test_a_requested_boot_whose_pod_is_not_made_yet_gets_the_new_keys() -> None:
    """The controller has not created boot 1's launcher Pod (no ``status.pod``): that boot is built from the spec
    the re-key writes, so it is the one with the new keys and nothing warns."""
    api = FakeApi()
    backend(api).ensure(params(power_state="running", ssh_authorized_keys=[OLD_KEY]), check_mode=False, diff=False)
    api.set_status("ns", "vm1", phase="Pending", reason="Starting", message="boot 1 requested", bootID=1)
    rekeyed = backend(api).ensure(params(ssh_authorized_keys=[NEW_KEY]), check_mode=False, diff=False)
    assert (rekeyed["boot_id"], rekeyed["ssh_authorized_keys_boot_id"]) == (1, 1)
    assert "warnings" not in rekeyed
    api.set_status("ns", "vm1", phase="Pending", reason="Starting", message="boot 1 requested", bootID=1,
                   pod="vm1-boot-1")  # now made: its Pod keeps the keys it was made with
    again = backend(api).ensure(params(ssh_authorized_keys=[OLD_KEY]), check_mode=False, diff=False)
    assert again["ssh_authorized_keys_boot_id"] == 2
    (warning,) = again["warnings"]
    assert warning.startswith("spec.sshAuthorizedKeys change takes effect at the next boot (bootID 2): boot 1 keeps")


def test_wait_timeout_names_last_phase_and_reason() -> None:
    api = FakeApi()

    def stuck() -> None:
        spec = api.objects[("ns", "vm1")]["spec"]
        api.set_status("ns", "vm1", phase="Pending", reason="WaitingForSSH", bootID=spec["bootID"],
                       message="boot 1 started, waiting for the SSH banner")

    with pytest.raises(CloudVMError) as err:
        backend(api, Clock(stuck)).ensure(params(power_state="running", wait=True, wait_timeout=5),
                                          check_mode=False, diff=False)
    msg = str(err.value)
    assert "timed out after 5 s" in msg
    assert "phase Pending, reason WaitingForSSH" in msg
    assert err.value.details["changed"] is True


def _node_lost(api: FakeApi) -> Callable[[], None]:
    """A clock hook: the controller's status for vm1's boot 1 once its node node-2 is lost."""
    def lost() -> None:
        api.set_status("ns", "vm1", phase="Unknown", reason="NodeLost", bootID=1, node="node-2",
                       message="node node-2 is not Ready; the launcher of boot 1 cannot be observed")
    return lost


def test_a_stop_waiting_on_a_lost_node_says_what_the_operator_can_do() -> None:
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    with pytest.raises(CloudVMError) as err:
        backend(api, Clock(_node_lost(api))).ensure(params(power_state="stopped", wait=True, wait_timeout=5),
                                                    check_mode=False, diff=False)
    msg = str(err.value)
    assert "phase Unknown, reason NodeLost" in msg and "node node-2, which is lost" in msg, msg
    assert "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in msg and "fences the old launcher" in msg, msg


def test_start_and_restart_of_a_vm_on_a_lost_node_ask_for_one_new_boot() -> None:
    """vm_start / vm_restart of a VM whose launcher's node is lost: boot 1 can never be seen Running or Stopped
    again, so each asks for boot 2 (without waiting for a stop), and a second run asks for nothing more."""
    for restart in (False, True):
        api = FakeApi()
        backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
        api.set_status("ns", "vm1", phase="Unknown", reason="NodeLost", bootID=1, node="node-2")
        ask = params(power_state="running", restart=restart, wait=False)
        first = backend(api).ensure(ask, check_mode=False, diff=False)
        assert first["changed"] is True and first["boot_id"] == 2, (restart, first)
        assert api.objects[("ns", "vm1")]["spec"]["powerState"] == "Running"
        again = backend(api).ensure(params(power_state="running", wait=False), check_mode=False, diff=False)
        assert again["changed"] is False and again["boot_id"] == 2, (restart, again)


def test_wait_for_running_fails_fast_when_the_boot_failed() -> None:
    api = FakeApi()

    def crash() -> None:
        spec = api.objects[("ns", "vm1")]["spec"]
        api.set_status("ns", "vm1", phase="Failed", reason="HypervisorCrashed", bootID=spec["bootID"])

    clock = Clock(crash)
    with pytest.raises(CloudVMError, match="boot 1 ended in phase Failed \\(reason HypervisorCrashed\\)"):
        backend(api, clock).ensure(params(power_state="running", wait=True, wait_timeout=600),
                                   check_mode=False, diff=False)
    assert clock.now < 5


def test_stale_status_from_an_older_generation_does_not_satisfy_a_stop_wait() -> None:
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    api.set_status("ns", "vm1", phase="Stopped", reason="NeverStarted", bootID=0)  # observed generation 1 ...
    obj = api.objects[("ns", "vm1")]
    obj["status"]["observedGeneration"] = obj["metadata"]["generation"] - 1  # ... is older than the spec
    assert lc.target_reached(obj, "Stopped") is False
    obj["status"]["observedGeneration"] = obj["metadata"]["generation"]
    assert lc.target_reached(obj, "Stopped") is True


def test_absent_deletes_and_second_run_changes_nothing() -> None:
    api = FakeApi()
    backend(api).ensure(params(), check_mode=False, diff=False)
    checked = backend(api).ensure(params(state="absent", wait=True), check_mode=True, diff=False)
    assert checked["changed"] is True and ("ns", "vm1") in api.objects
    gone = backend(api).ensure(params(state="absent", wait=True), check_mode=False, diff=True)
    assert gone["changed"] is True and "cloudvm" not in gone and gone["diff"]["after"] == {}
    assert backend(api).ensure(params(state="absent"), check_mode=False, diff=False)["changed"] is False


def test_delete_volume_of_an_absent_vm_deletes_the_volume_it_kept_once_and_only_for_its_owner() -> None:
    api = FakeApi()
    backend(api).ensure(params(), check_mode=False, diff=False)
    backend(api).ensure(params(state="absent"), check_mode=False, diff=False)  # the volume is kept
    with pytest.raises(CloudVMError, match="belongs to owner 'alice'"):
        backend(api).ensure(params(state="absent", owner="bob", delete_volume=True), check_mode=False, diff=False)
    with pytest.raises(CloudVMError, match="owner: required with delete_volume"):
        backend(api).ensure(params(state="absent", owner=None, delete_volume=True), check_mode=False, diff=False)
    checked = backend(api).ensure(params(state="absent", delete_volume=True), check_mode=True, diff=False)
    assert checked == {"changed": True, "volume_deleted": "vm1-root"} and "vm1-root" in api.kept_volumes
    gone = backend(api).ensure(params(state="absent", delete_volume=True), check_mode=False, diff=False)
    assert gone == {"changed": True, "volume_deleted": "vm1-root"} and api.kept_volumes == {}
    again = backend(api).ensure(params(state="absent", delete_volume=True), check_mode=False, diff=False)
    assert again == {"changed": False}
    assert backend(api).ensure(params(state="absent"), check_mode=False, diff=False) == {"changed": False}


def test_host_only_options_warn() -> None:
    result = backend(FakeApi()).ensure(params(image="debian-bookworm"), check_mode=False, diff=False)
    assert result["warnings"] == ["image is ignored by the kubernetes backend (host backend only)"]


def test_info_filters_by_owner_and_name_sorted() -> None:
    api = FakeApi()
    for ns, name, owner in (("b", "x", "alice"), ("a", "y", "alice"), ("a", "z", "bob")):
        backend(api).ensure(params(namespace=ns, name=name, owner=owner), check_mode=False, diff=False)
    got = backend(api).info({"owner": "alice", "namespace": None, "name": None, "label_selectors": []})
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in got] == [("a", "y"), ("b", "x")]
    one = backend(api).info({"owner": None, "namespace": None, "name": "z", "label_selectors": []})
    assert [o["metadata"]["name"] for o in one] == ["z"]


class _FakeApiException(Exception):
    def __init__(self, status: int, body: Any, reason: str = "Unprocessable Entity") -> None:
        super().__init__(status)
        self.status, self.reason = status, reason
        self.body = body if isinstance(body, str) else json.dumps(body)


def test_api_error_keeps_the_servers_message_and_causes() -> None:
    body = {"kind": "Status", "reason": "Invalid", "code": 422,
            "message": 'CloudVM.cloud.zjusct.io "vm1" is invalid: spec.owner: Invalid value: "string": is immutable',
            "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.owner", "message": "is immutable"}]}}
    err = k8s.api_error(_FakeApiException(422, body), "replace CloudVM")  # type: ignore[arg-type]
    assert str(err).startswith("replace CloudVM: CloudVM.cloud.zjusct.io \"vm1\" is invalid: spec.owner:")
    assert err.details == {"api_status": 422, "api_reason": "Invalid", "api_missing": False,
                           "field_errors": [{"field": "spec.owner", "message": "is immutable"}]}


def test_missing_crd_is_reported_as_such_not_as_an_absent_vm() -> None:
    body = {"kind": "Status", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource"}
    err = k8s.api_error(_FakeApiException(404, body), "get CloudVM")  # type: ignore[arg-type]
    assert "the CloudVM API is not installed on this cluster" in str(err) and err.details["api_missing"] is True


def test_a_404_page_not_found_is_a_missing_api_and_an_absent_object_is_not() -> None:
    """kube-apiserver answers a path it does not serve (no CloudVM CRD) with a plain-text 404, for get and list
    alike (measured): that is the missing API, named with how to install it; a 404 Status NotFound is one absent
    object."""
    err = k8s.api_error(_FakeApiException(404, "404 page not found\n", "Not Found"),  # type: ignore[arg-type]
                        "list CloudVM")
    assert str(err).startswith("list CloudVM: HTTP 404 Not Found; the CloudVM API is not installed on this cluster")
    assert "site.yml -e zjusct_cloud_backend=kubernetes" in str(err) and err.details["api_missing"] is True
    absent = {"kind": "Status", "reason": "NotFound", "code": 404,
              "message": 'cloudvms.cloud.zjusct.io "vm1" not found'}
    err = k8s.api_error(_FakeApiException(404, absent, "Not Found"), "get CloudVM")  # type: ignore[arg-type]
    assert err.details["api_missing"] is False and "not installed" not in str(err)


@pytest.mark.parametrize("change", [{"power_state": "running"}, {"power_state": "stopped"}, {"restart": True},
                                    {"ssh_authorized_keys": ["ssh-ed25519 AAAAC3Nz eve"]}, {"state": "absent"}],
                         ids=["start", "stop", "restart", "rekey", "delete"])
def test_another_owner_is_refused_before_any_write(change: dict) -> None:
    api = FakeApi()
    backend(api).ensure(params(), check_mode=False, diff=False)
    writes = api.writes
    with pytest.raises(CloudVMError, match="owner: 'bob' may not act on CloudVM ns/vm1, which belongs to owner"
                                           " 'alice'") as err:
        backend(api).ensure(params(owner="bob", **change), check_mode=False, diff=False)
    assert err.value.details == {"reason": "Forbidden", "vm_owner": "alice"}
    assert api.writes == writes and ("ns", "vm1") in api.objects


def test_operator_switch_acts_on_a_vm_of_another_owner() -> None:
    api = FakeApi()
    backend(api).ensure(params(), check_mode=False, diff=False)
    gone = backend(api).ensure(params(owner="ops", operator=True, state="absent"), check_mode=False, diff=False)
    assert gone["changed"] is True and ("ns", "vm1") not in api.objects


def test_stop_wait_ending_on_failed_says_so_in_a_warning() -> None:
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)

    def crashed() -> None:  # the boot crashed before the stop was carried out: the VM is off, as Failed
        api.set_status("ns", "vm1", phase="Failed", reason="HypervisorCrashed", bootID=1, message="qemu exited 139")

    stopped = backend(api, Clock(on_sleep=crashed)).ensure(params(power_state="stopped", wait=True),
                                                           check_mode=False, diff=False)
    assert stopped["phase"] == "Failed"
    assert stopped["warnings"] == ["ns/vm1 is off, but boot 1 ended in phase Failed (reason HypervisorCrashed):"
                                   " qemu exited 139"]
    api.set_status("ns", "vm1", phase="Stopped", reason="StopRequested", bootID=1)
    clean = backend(api).ensure(params(power_state="stopped", wait=True), check_mode=False, diff=False)
    assert "warnings" not in clean, "a clean stop warns about nothing"


def test_wait_for_running_fails_fast_with_the_quota_refusal_and_the_hosts_failure_fields() -> None:
    api = FakeApi()
    message = ("vcpus: owner 'alice' would use 3 of quota 2 vCPUs (in use 2, this request 1, asked by vcpus, "
               "spec.vcpus of CloudVM ns/vm1); stop another VM of 'alice', or ask the operator to raise owner_quota "
               "vcpus")

    def refuse() -> None:
        spec = api.objects[("ns", "vm1")]["spec"]
        api.set_status("ns", "vm1", phase="Blocked", reason="QuotaExceeded", bootID=spec["bootID"], message=message)

    clock = Clock(refuse)
    with pytest.raises(CloudVMError) as err:
        backend(api, clock).ensure(params(power_state="running", wait=True, wait_timeout=600),
                                   check_mode=False, diff=False)
    assert clock.now < 5  # not the 600 s timeout
    assert str(err.value).startswith(f"CloudVM ns/vm1: boot 1 refused (QuotaExceeded): {message}; the VM stays "
                                     "asked to run")
    assert {k: err.value.details[k] for k in ("reason", "quota", "owner", "limit", "in_use", "requested",
                                              "changed", "phase")} == {
        "reason": "QuotaExceeded", "quota": "vcpus", "owner": "alice", "limit": 2, "in_use": 2, "requested": 1,
        "changed": True, "phase": "Blocked"}


def test_a_refusal_of_an_older_generation_or_boot_does_not_end_the_wait() -> None:
    api = FakeApi()
    backend(api).ensure(params(power_state="running"), check_mode=False, diff=False)
    obj = api.objects[("ns", "vm1")]
    api.set_status("ns", "vm1", phase="Blocked", reason="Refused", bootID=obj["spec"]["bootID"], message="m")
    assert lc.refusal(obj, "Running") == ("Refused", "m")
    obj["status"]["observedGeneration"] = obj["metadata"]["generation"] - 1
    assert lc.refusal(obj, "Running") is None
    obj["status"].update(observedGeneration=obj["metadata"]["generation"], bootID=obj["spec"]["bootID"] - 1)
    assert lc.refusal(obj, "Running") is None
    api.set_status("ns", "vm1", phase="Stopping", reason="Refused", bootID=1, message="delete refused")
    assert lc.refusal(api.objects[("ns", "vm1")], "Stopped") == ("Refused", "delete refused")
    api.set_status("ns", "vm1", phase="Blocked", reason="VolumeInUse", bootID=1, message="x")
    assert lc.refusal(api.objects[("ns", "vm1")], "Running") is None  # waits on: it clears by itself


# --------------------------------------------------------------------------- a Running status with a doubt


class _RawBody:
    def __init__(self, doc: dict) -> None:
        self.data = json.dumps(doc).encode()


class FakeCore:
    """``CoreV1Api.read_namespaced_pod`` over ``pods`` ({name: Pod JSON}, namespace ns) and ``read_node`` over
    ``nodes`` ({name: Node JSON}); ``forbidden``: every read is refused with 403; ``reads`` counts the GETs."""

    def __init__(self, **pods: dict) -> None:
        self.pods = pods
        self.nodes: dict[str, dict] = {}
        self.forbidden = False
        self.reads = 0

    def read_node(self, name: str, **kwargs: Any) -> _RawBody:
        from kubernetes.client.exceptions import ApiException

        self.reads += 1
        if self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return _RawBody(self.nodes[name])

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> _RawBody:
        from kubernetes.client.exceptions import ApiException

        self.reads += 1
        if self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        if namespace != "ns" or name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return _RawBody(self.pods[name])


def launcher(ready: str, node: str = "node-2") -> dict:
    """A launcher Pod as kube-apiserver returns it; ``ready`` False as the node lifecycle controller leaves it."""
    return {"metadata": {"name": "vm1-boot-1", "namespace": "ns"}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-06T20:35:10Z"}]}}


def running_vm_with(core: FakeCore) -> FakeApi:
    """VM ns/vm1 whose status says Running for boot 1 in launcher Pod vm1-boot-1, then a controller that writes
    nothing more (its only replica was on the lost node)."""
    api = FakeApi()
    backend(api, Clock(obedient_controller(api))).ensure(params(power_state="running", wait=True),
                                                         check_mode=False, diff=False)
    api._core = core
    return api


def test_vm_start_on_a_running_vm_whose_launcher_pod_is_not_ready_waits_and_times_out_naming_the_doubt() -> None:
    core = FakeCore(**{"vm1-boot-1": launcher("False")})
    api = running_vm_with(core)
    clock = Clock()
    with pytest.raises(CloudVMError) as err:
        backend(api, clock).ensure(params(power_state="running", wait=True, wait_timeout=5),
                                   check_mode=False, diff=False)
    msg = str(err.value)
    assert msg.startswith("CloudVM ns/vm1: timed out after 5 s waiting until Running (SSH ready) with bootID 1; "
                          "last phase Running, reason SSHReady, status.bootID 1; "), msg
    assert ("status says Running but launcher Pod vm1-boot-1 is not Ready (Ready=False, since 2026-12-06T20:35:10Z)"
            " on node node-2") in msg, msg
    assert "the controller has not recorded that (it may be down or unable to update the status)" in msg
    assert err.value.details["changed"] is False and err.value.details["phase"] == "Running"
    assert err.value.details["running_doubt"] in msg
    assert clock.now >= 5 and core.reads >= 5, "it kept polling until the timeout"


def test_a_running_status_whose_launcher_pod_is_gone_is_not_taken_either() -> None:
    api = running_vm_with(FakeCore())
    with pytest.raises(CloudVMError, match="status says Running but launcher Pod ns/vm1-boot-1 is gone"):
        backend(api).ensure(params(power_state="running", wait=True, wait_timeout=3), check_mode=False, diff=False)


def test_a_wait_that_sees_the_launcher_pod_become_ready_returns_running() -> None:
    core = FakeCore(**{"vm1-boot-1": launcher("False")})
    api = running_vm_with(core)

    def node_back() -> None:
        if core.reads >= 3:
            core.pods["vm1-boot-1"] = launcher("True")

    clock = Clock(node_back)
    result = backend(api, clock).ensure(params(power_state="running", wait=True, wait_timeout=60),
                                        check_mode=False, diff=False)
    assert (result["changed"], result["phase"], result["boot_id"]) == (False, "Running", 1)
    assert 0 < clock.now < 60 and core.reads == 4


def test_a_ready_launcher_pod_costs_one_get_once_the_status_says_running_and_none_before() -> None:
    core = FakeCore(**{"vm1-boot-1": launcher("True")})
    api = FakeApi()
    api._core = core
    polls = {"n": 0}

    def boots_slowly() -> None:
        polls["n"] += 1
        obj = api.objects[("ns", "vm1")]
        if polls["n"] < 4:
            api.set_status("ns", "vm1", phase="Pending", reason="WaitingForSSH", bootID=obj["spec"]["bootID"],
                           pod="vm1-boot-1")
        else:
            obedient_controller(api)()

    result = backend(api, Clock(boots_slowly)).ensure(params(power_state="running", wait=True), check_mode=False,
                                                      diff=False)
    assert result["phase"] == "Running" and core.reads == 1


def test_a_caller_who_may_not_read_pods_gets_the_status_as_written() -> None:
    core = FakeCore(**{"vm1-boot-1": launcher("False")})
    core.forbidden = True
    api = running_vm_with(core)
    clock = Clock()
    result = backend(api, clock).ensure(params(power_state="running", wait=True, wait_timeout=60),
                                        check_mode=False, diff=False)
    assert result["phase"] == "Running" and clock.now == 0 and core.reads == 1


def test_a_start_waiting_on_a_boot_whose_node_was_lost_meanwhile_says_to_start_again() -> None:
    """A wait for Running whose boot's node is lost keeps waiting (a node NotReady for a moment must not cost a
    reboot) and its timeout says what the operator does: taint, then start again (a new boot)."""
    api = FakeApi()
    with pytest.raises(CloudVMError) as err:
        backend(api, Clock(_node_lost(api))).ensure(params(power_state="running", wait=True, wait_timeout=5),
                                                    check_mode=False, diff=False)
    msg = str(err.value)
    assert "timed out after 5 s" in msg and "phase Unknown, reason NodeLost" in msg, msg
    assert "node node-2, which is lost" in msg and "start the VM again" in msg, msg
    assert api.get("ns", "vm1")["spec"]["bootID"] == 1  # no new boot asked for by the wait itself


# --------------------------------------------------------------------------- a start on an out-of-service node


def _stale_running_on(core: FakeCore, taints: list[dict], ready: str = "Unknown") -> FakeApi:
    """VM ns/vm1 whose status still says Running for boot 1 on node-2 (its controller silent, as after a restart
    that has not looked at the node yet), node-2 carrying ``taints``, its Ready condition ``ready``."""
    api = running_vm_with(core)
    api.set_status("ns", "vm1", phase="Running", reason="SSHReady", bootID=1, pod="vm1-boot-1", node="node-2")
    core.nodes["node-2"] = {"metadata": {"name": "node-2"}, "spec": {"taints": taints},
                            "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    return api


OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def test_a_start_after_the_operators_out_of_service_taint_asks_for_a_new_boot_whatever_the_status_says() -> None:
    """The operator's recovery (taint, vm_start) while the controller has not yet written Unknown/NodeLost: the
    start asks for boot 2 at once instead of waiting for a boot whose guest is gone (the fault campaign's case)."""
    core = FakeCore(**{"vm1-boot-1": launcher("False")})
    api = _stale_running_on(core, [OUT_OF_SERVICE, {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    result = backend(api).ensure(params(power_state="running", wait=False), check_mode=False, diff=False)
    assert (result["changed"], result["boot_id"]) == (True, 2), result
    assert api.get("ns", "vm1")["spec"]["bootID"] == 2


def test_a_start_on_a_node_without_the_taint_ready_again_or_that_cannot_be_read_keeps_the_boot() -> None:
    for taints, ready, forbidden in (
            ([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}], "Unknown", False),
            ([OUT_OF_SERVICE], "True", False),  # back and Ready before the operator removed the taint: not off
            ([OUT_OF_SERVICE], "Unknown", True)):  # a tenant may not read Nodes: the status as written
        core = FakeCore(**{"vm1-boot-1": launcher("True")})
        api = _stale_running_on(core, taints, ready)
        core.forbidden = forbidden
        result = backend(api).ensure(params(power_state="running", wait=False), check_mode=False, diff=False)
        assert (result["changed"], result["boot_id"]) == (False, 1), (taints, ready, forbidden, result)


def test_the_node_is_read_only_for_a_start_of_a_live_boot_on_a_named_node() -> None:
    core = FakeCore(**{"vm1-boot-1": launcher("True")})
    api = _stale_running_on(core, [OUT_OF_SERVICE])
    reads = core.reads
    backend(api).ensure(params(power_state="stopped", wait=False), check_mode=False, diff=False)
    assert core.reads == reads, "a stop reads no Node"
    api.set_status("ns", "vm1", phase="Stopped", reason="StopRequested", bootID=1, node="node-2")
    result = backend(api).ensure(params(power_state="running", wait=False), check_mode=False, diff=False)
    assert result["boot_id"] == 2 and core.reads == reads, "a start of an ended boot needs no Node either"


def test_a_root_volume_size_is_written_a_running_vm_is_told_and_it_never_decreases() -> None:
    api = FakeApi()
    clock = Clock(obedient_controller(api))
    backend(api, clock).ensure(params(power_state="running", wait=True), check_mode=False, diff=False)
    grown = backend(api, clock).ensure(params(volume_size_mib=4096), check_mode=False, diff=False)
    assert api.objects[("ns", "vm1")]["spec"]["rootVolumeSizeMiB"] == 4096
    assert grown["warnings"] == [
        "spec.rootVolumeSizeMiB none -> 4096: takes effect at the next boot (bootID 2); boot 1 keeps its root disk"
        " size until it ends; restart the VM (restart: true, playbook vm_restart) to apply it now"]
    assert backend(api, clock).ensure(params(volume_size_mib=4096), check_mode=False, diff=False)["changed"] is False
    with pytest.raises(CloudVMError, match=r"spec.rootVolumeSizeMiB: must never decrease \(was 4096, requested 2048\)"
                                           r"; a root volume only grows"):
        backend(api, clock).ensure(params(volume_size_mib=2048), check_mode=False, diff=False)
    with pytest.raises(CloudVMError, match=r"spec.rootVolumeSizeMiB: 0 is below the minimum 1"):
        backend(api, clock).ensure(params(volume_size_mib=0), check_mode=False, diff=False)
    assert api.objects[("ns", "vm1")]["spec"]["rootVolumeSizeMiB"] == 4096
