"""HostReconciler.reconcile (plugins/module_utils/host/reconciler.py) driven through in-memory fakes of its ports
(plugins/module_utils/host/ports.py): what one pass starts, stops, cleans up and leaves behind after a failure.

These are in addition to the real tests of the host backend (tests/e2e/host/test_host_backend.py and
test_recreate_and_errors.py boot real guests; tests/unit/cloudvm/test_placement_refusal.py uses the real store).
The fakes record what the backend asked of each port; nothing here touches a process, a netns or a file outside
tmp_path.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import HostReconciler
from ansible_collections.zjusct.cloud.plugins.module_utils.host.supervisor import LauncherError, LauncherPaths
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError, host_action
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import with_defaults
from ansible_collections.zjusct.cloud.plugins.module_utils.network.hostnet import NetworkError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import VolumeSettings

UID = "uid-1"


# --- the fakes (each holds only what its port's Protocol names) --------------------------------------
class FakeStore:
    """:class:`host.ports.Store` in memory; a transaction is undone when its block raises."""

    def __init__(self) -> None:
        self.vms: dict = {}
        self.volumes: dict = {}
        self.allocs: dict = {}
        self.lease_table: dict = {}
        self.events: list = []
        self._depth = 0

    def _tables(self) -> tuple:
        return self.vms, self.volumes, self.allocs, self.lease_table, self.events

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            yield None
            return
        saved = copy.deepcopy(self._tables())
        self._depth = 1
        try:
            yield None
        except BaseException:
            self.vms, self.volumes, self.allocs, self.lease_table, self.events = saved
            raise
        finally:
            self._depth = 0

    def list_vms(self, namespace: Optional[str] = None, owner: Optional[str] = None) -> list[dict]:
        return [copy.deepcopy(vm) for (ns, _), vm in self.vms.items()
                if namespace in (None, ns) and owner in (None, vm["spec"].get("owner"))]

    def update_vm(self, namespace: str, name: str, spec: Optional[dict] = None, status: Optional[dict] = None,
                  labels: Optional[dict] = None) -> None:
        vm = self.vms[(namespace, name)]
        for key, value in (("spec", spec), ("status", status)):
            if value is not None:
                vm[key] = copy.deepcopy(value)

    def get_volume(self, name: str) -> Optional[dict]:
        return copy.deepcopy(self.volumes.get(name))

    def volume(self, name: str) -> dict:
        """The volume record, which the test knows exists."""
        return copy.deepcopy(self.volumes[name])

    def put_volume(self, volume: dict) -> None:
        self.volumes[volume["name"]] = copy.deepcopy(volume)

    def allocations(self, node: Optional[str] = None) -> list[dict]:
        return [dict(a) for a in self.allocs.values() if node is None or a["node"] == node]

    def put_allocation(self, alloc: dict) -> None:
        self.allocs[alloc["vm_uid"]] = dict(alloc)

    def delete_allocation(self, vm_uid: str) -> None:
        self.allocs.pop(vm_uid, None)

    def leases(self) -> list[dict]:
        return [dict(x) for x in self.lease_table.values()]

    def lease_for(self, vm_uid: str) -> Optional[dict]:
        found = self.lease_table.get(vm_uid)
        return dict(found) if found else None

    def put_lease(self, lease: dict) -> None:
        self.lease_table[lease["vm_uid"]] = dict(lease)

    def record_event(self, kind: str, subject: str, reason: str, message: str, data: Optional[dict] = None) -> None:
        self.events.append({"kind": kind, "subject": subject, "reason": reason, "message": message})


class FakeNetwork:
    def __init__(self) -> None:
        self.taps: set = set()
        self.detached: list = []
        self.fail_attach: Optional[Exception] = None

    def new_lease(self, vm_uid: str, taken: list[str]) -> dict:
        return {"ipv4": f"10.200.0.{2 + len(taken)}", "vm_uid": vm_uid, "mac": "02:00:00:00:00:02",
                "tap": f"zt{vm_uid[-4:]}"}

    def attach(self, lease: dict) -> None:
        if self.fail_attach is not None:
            raise self.fail_attach
        self.taps.add(lease["tap"])

    def detach(self, lease: dict) -> None:
        self.taps.discard(lease["tap"])
        self.detached.append(lease["tap"])

    def serial_console(self, vm: dict) -> None:
        return None


class FakeSupervisor:
    """Boots on disk with a state each; ``live`` is the launcher holding the lock."""

    def __init__(self) -> None:
        self.states: dict = {}
        self.live: Optional[tuple[int, int]] = None
        self.configs: list = []
        self.stops: list = []
        self.fail_start: Optional[Exception] = None

    def boots(self, paths: LauncherPaths) -> list[int]:
        return sorted(self.states)

    def running_boot(self, paths: LauncherPaths) -> Optional[tuple[int, int]]:
        return self.live

    def observe(self, paths: LauncherPaths, boot_id: int, locks: Any = None) -> BootObservation:
        state = self.states[boot_id]
        result = {"reason": "GuestShutdown", "exitCode": 0, "finishedAt": "2026-01-01T00:01:00Z"} \
            if state == "exited" else None
        return BootObservation(boot_id, state, ready_at="2026-01-01T00:00:30Z" if state == "alive" else None,
                               result=result, node="test-host")

    def request_stop(self, paths: LauncherPaths, boot_id: int) -> bool:
        if boot_id in self.stops:
            return False
        self.stops.append(boot_id)
        return True

    def start(self, paths: LauncherPaths, config: dict) -> int:
        if self.fail_start is not None:
            raise self.fail_start  # the real one removes the config it wrote: no boot on disk
        boot = int(config["vm"]["bootID"])
        self.configs.append(config)
        self.states[boot] = "starting"
        self.live = (boot, 4242)
        return 4242


class FakeBandwidth:
    def __init__(self) -> None:
        self.applied: dict = {}
        self.released: list = []
        self.refuse: Optional[str] = None

    def apply(self, vm: dict, lease: dict) -> None:
        band = (vm["spec"].get("network") or {}).get("bandwidth") or {}
        if self.refuse:
            raise CloudVMError(f"spec.network.bandwidth: {self.refuse}", dimension="bandwidth")
        if band.get("guaranteedMbps"):
            self.applied[vm["metadata"]["uid"]] = band["guaranteedMbps"]

    def release(self, vm_uid: str) -> None:
        self.applied.pop(vm_uid, None)
        self.released.append(vm_uid)


class FakeDriver:
    name = "fake"

    def __init__(self) -> None:
        self.claims: list = []
        self.blocker: Optional[str] = None

    def claim(self, settings: VolumeSettings, volume: dict, vm_uid: str) -> None:
        self.claims.append((volume["name"], vm_uid))

    def boot_blocker(self, settings: VolumeSettings, volume: Optional[dict]) -> Optional[str]:
        return self.blocker

    def root_disk(self, settings: VolumeSettings, volume: dict) -> dict:
        return {"type": "file", "path": volume["location"], "format": "raw"}


class FakeVolumes:
    def __init__(self) -> None:
        self.fake = FakeDriver()

    def settings(self) -> VolumeSettings:
        return VolumeSettings()

    def driver(self, name: Optional[str]) -> FakeDriver:
        assert name == "fake"
        return self.fake


class World:
    """A backend over the fakes, with one VM ``default/vm1`` of alice whose root volume ``vm1-root`` exists."""

    def __init__(self, tmp_path: Path, power: str = "Running", boot: int = 1, bandwidth: int = 100) -> None:
        image = tmp_path / "image"
        image.mkdir()
        (image / "manifest.json").write_text(json.dumps({"defaultCmdline": "console=ttyS0"}))
        self.cfg = HostConfig(node="test-host", state_dir=str(tmp_path / "state"),
                              runtime_dir=str(tmp_path / "run"), log_dir=str(tmp_path / "log"),
                              volumes_dir=str(tmp_path / "volumes"), netns="", dns=("10.200.0.1",),
                              physical={"cpu": 4, "memory": 8192, "disk": 102400})
        self.store, self.network, self.supervisor = FakeStore(), FakeNetwork(), FakeSupervisor()
        self.bandwidth, self.volumes = FakeBandwidth(), FakeVolumes()
        self.backend = HostReconciler(self.cfg, self.store, self.network, self.supervisor, self.bandwidth,
                                   self.volumes)
        self.store.put_volume({"name": "vm1-root", "driver": "fake", "location": str(tmp_path / "vm1-root.raw"),
                               "size_mib": 1024, "owner": "alice", "claimed_by": None, "image": str(image)})
        spec = with_defaults({"owner": "alice", "rootVolumeClaim": "vm1-root", "vcpus": 2, "memoryMiB": 1024,
                              "powerState": power, "bootID": boot,
                              "network": {"bandwidth": {"guaranteedMbps": bandwidth, "priority": 0}}})
        self.store.vms[("default", "vm1")] = {
            "metadata": {"namespace": "default", "name": "vm1", "uid": UID, "generation": 1, "labels": {}},
            "spec": spec, "status": {}}

    @property
    def vm(self) -> dict:
        return copy.deepcopy(self.store.vms[("default", "vm1")])

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.store.events]


# --- the cases -----------------------------------------------------------------------------------
def test_start_from_stopped_spawns_one_boot_with_the_volume_claimed_and_bandwidth_applied(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    status = world.backend.reconcile(world.vm)
    (config,) = world.supervisor.configs
    assert config["vm"] == {"namespace": "default", "name": "vm1", "uid": UID, "bootID": 1}
    assert config["rootDisk"]["path"] == str(tmp_path / "vm1-root.raw")
    assert world.store.volume("vm1-root")["claimed_by"] == UID and world.volumes.fake.claims == [("vm1-root", UID)]
    assert world.bandwidth.applied == {UID: 100}
    lease = world.store.lease_for(UID)
    assert lease is not None and world.network.taps == {lease["tap"]} and config["network"]["tap"] == lease["tap"]
    assert world.store.allocations("test-host")[0]["vcpus"] == 2
    assert status["phase"] == "Pending" and status["bootID"] == 1
    assert status["sshEndpoint"] == {"host": lease["ipv4"], "port": 22}
    assert world.vm["status"] == status and "Started" in world.reasons()
    # a second pass while the launcher runs starts nothing more (one launcher per bootID)
    world.supervisor.states[1] = "alive"
    again = world.backend.reconcile(world.vm)
    assert len(world.supervisor.configs) == 1 and again["phase"] == "Running"


def test_a_running_boot_whose_spec_asks_stopped_is_asked_to_stop_once(tmp_path: Path) -> None:
    world = World(tmp_path, power="Stopped", boot=1)
    world.supervisor.states[1], world.supervisor.live = "alive", (1, 4242)
    status = world.backend.reconcile(world.vm)
    assert world.supervisor.stops == [1] and world.reasons() == ["StopRequested"]
    assert status["phase"] == "Stopping"
    world.backend.reconcile(world.vm)
    assert world.supervisor.stops == [1] and world.reasons() == ["StopRequested"]  # asked once per boot
    assert world.supervisor.configs == []


def test_an_ended_boot_is_cleaned_up_releasing_tap_bandwidth_and_allocation(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.backend.reconcile(world.vm)
    lease = world.store.lease_for(UID)
    assert lease is not None and world.bandwidth.applied and world.store.allocations()
    world.supervisor.states[1], world.supervisor.live = "exited", None  # the guest powered off
    status = world.backend.reconcile(world.vm)
    assert status["phase"] == "Stopped"
    assert world.bandwidth.applied == {} and world.bandwidth.released == [UID]
    assert world.network.taps == set() and world.network.detached == [lease["tap"]]
    assert world.store.allocations() == []
    # the address lease and the volume claim stay with the VM
    assert world.store.lease_for(UID) == lease and world.store.volume("vm1-root")["claimed_by"] == UID
    assert len(world.supervisor.configs) == 1  # an ended boot is not started again without a new bootID


def test_a_launcher_failure_mid_start_releases_tap_bandwidth_and_allocation(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.supervisor.fail_start = LauncherError("launcher rejected its config: hypervisor.accel: 'xyz'")
    with pytest.raises(CloudVMError, match=r"hypervisor\.accel"):
        world.backend.reconcile(world.vm)
    assert world.supervisor.configs == [] and world.supervisor.states == {}
    assert world.network.taps == set() and world.bandwidth.applied == {} and world.bandwidth.released == [UID]
    assert world.store.allocations() == []
    # what the current code keeps on this path: the lease and the store's claim (the VM's, reused at the next start)
    assert world.store.lease_for(UID) is not None and world.store.volume("vm1-root")["claimed_by"] == UID
    status = world.vm["status"]
    assert (status["phase"], status["reason"], status["bootID"]) == ("Failed", "StartFailed", 1)
    assert "Started" not in world.reasons()


def test_a_tap_attach_failure_mid_start_releases_the_allocation(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.network.fail_attach = NetworkError("ip link add zt0001: File exists")
    with pytest.raises(CloudVMError, match="File exists"):
        world.backend.reconcile(world.vm)
    assert world.supervisor.configs == [] and world.bandwidth.applied == {} and world.network.taps == set()
    assert world.store.allocations() == [], "capacity of a start that never ran stays counted"
    status = world.vm["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "StartFailed")


def test_a_bandwidth_refusal_mid_start_detaches_the_tap_and_releases_the_allocation(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.bandwidth.refuse = "guarantee 100 Mbit/s exceeds pool default (0 free)"
    with pytest.raises(CloudVMError, match=r"spec\.network\.bandwidth"):
        world.backend.reconcile(world.vm)
    assert world.supervisor.configs == [] and world.network.taps == set() and world.store.allocations() == []
    status = world.vm["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "Unschedulable")


def test_a_start_that_does_not_fit_writes_nothing_and_spawns_nothing(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.store.vms[("default", "vm1")]["spec"]["vcpus"] = 64  # 4 CPUs x 4.0 overcommit hold 16
    with pytest.raises(CloudVMError) as refused:
        world.backend.reconcile(world.vm)
    assert refused.value.details["dimension"] == "cpu"
    assert world.store.allocations() == [] and world.store.lease_for(UID) is None
    assert world.store.volume("vm1-root")["claimed_by"] is None and world.volumes.fake.claims == []
    assert world.network.taps == set() and world.supervisor.configs == [] and world.bandwidth.applied == {}
    assert world.reasons() == ["InsufficientCapacity"]


def test_a_vm_whose_anti_affinity_group_runs_here_is_pending_unschedulable_and_holds_nothing(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.store.vms[("default", "vm1")]["spec"]["antiAffinityGroup"] = "web"
    peer = copy.deepcopy(world.store.vms[("default", "vm1")])
    peer["metadata"].update(name="vm0", uid="uid-0")
    world.store.vms[("default", "vm0")] = peer
    world.store.put_allocation({"vm_uid": "uid-0", "node": "test-host", "vcpus": 1, "memory_mib": 512,
                                "disk_mib": 1, "bandwidth_mbps": 0})
    with pytest.raises(CloudVMError, match=r"spec\.antiAffinityGroup: 'web': default/vm0 of owner alice"):
        world.backend.reconcile(world.vm)
    status = world.vm["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "Unschedulable") and "default/vm0" in status["message"]
    assert [a["vm_uid"] for a in world.store.allocations()] == ["uid-0"] and world.store.lease_for(UID) is None
    assert world.network.taps == set() and world.supervisor.configs == [] and world.reasons() == ["AntiAffinity"]


def test_another_writer_of_the_volume_blocks_the_start(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=1)
    world.volumes.fake.blocker = "RBD image p/vm1-root has watchers 10.0.0.9:0/1"
    status = world.backend.reconcile(world.vm)
    assert (status["phase"], status["reason"]) == ("Blocked", "VolumeInUse")
    assert world.supervisor.configs == [] and world.store.allocations() == [] and world.network.taps == set()


def test_an_older_boot_still_alive_blocks_the_new_one_and_is_asked_to_stop(tmp_path: Path) -> None:
    world = World(tmp_path, power="Running", boot=2)
    world.supervisor.states[1], world.supervisor.live = "alive", (1, 4242)
    status = world.backend.reconcile(world.vm)
    assert world.supervisor.stops == [1] and world.supervisor.configs == []
    assert (status["phase"], status["reason"]) == ("Blocked", "PreviousBootRunning")


@pytest.mark.parametrize(("power", "boot", "live", "latest", "action"), [
    ("Running", 1, None, None, "start"),  # never booted
    ("Running", 2, None, 1, "start"),  # a new bootID after an ended boot
    ("Running", 1, None, 1, None),  # boot 1 ended: not started again without a new bootID (case L5)
    ("Running", 1, 1, 1, None),  # runs as asked
    ("Running", 2, 1, 1, "stop"),  # an older boot still alive goes first (case L3)
    ("Stopped", 1, 1, 1, "stop"),
    ("Stopped", 1, None, 1, None),
])
def test_host_action_decides_stop_start_or_nothing(power: str, boot: int, live: Optional[int],
                                                   latest: Optional[int], action: Optional[str]) -> None:
    assert host_action({"powerState": power, "bootID": boot}, live, latest) == action
