"""The VMM seam (vmm.py): the registry, each adapter held to the Vmm Protocol and to its profile, and a capability
the run performs reached only on a VMM that has it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import capability, config, firecracker, qemu, vmm
from zjusct_launcher.capability import Capability, Profile
from zjusct_launcher.paths import RuntimePaths
from zjusct_launcher.vmm_firecracker import FirecrackerVmm
from zjusct_launcher.vmm_qemu import QemuVmm

EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def cfg(name: str) -> config.LauncherConfig:
    return config.parse(json.loads((EXAMPLES / name).read_text()))


def test_the_registry_has_one_adapter_per_hypervisor_type_with_that_types_profile() -> None:
    adapters = vmm.registered()
    assert tuple(adapters) == capability.VMM_TYPES
    assert adapters["qemu"] is QemuVmm and QemuVmm.profile is qemu.PROFILE
    assert adapters["firecracker"] is FirecrackerVmm and FirecrackerVmm.profile is firecracker.PROFILE
    for vmm_type in capability.VMM_TYPES:
        assert capability.profile(vmm_type).type == vmm_type


@pytest.mark.parametrize("adapter", [QemuVmm, FirecrackerVmm], ids=lambda a: a.__name__)
def test_every_registered_adapter_conforms(adapter: type) -> None:
    assert vmm.conformance_problems(adapter) == []


@pytest.mark.parametrize(("example", "adapter", "on_stdout"), [("config-qemu-tap.json", QemuVmm, False),
                                                               ("config-firecracker-tap.json", FirecrackerVmm, True)])
def test_for_config_makes_the_types_vmm_for_one_run(example: str, adapter: type, on_stdout: bool) -> None:
    c = cfg(example)
    made = vmm.for_config(c, RuntimePaths(c.runtime_dir))
    assert type(made) is adapter and made.console_on_stdout is on_stdout
    assert made.observed == vmm.Observed() and made.event_fds() == []  # nothing attached yet
    second = vmm.for_config(c, RuntimePaths(c.runtime_dir))
    assert second is not made and second.observed is not made.observed, "one Vmm (and its state) per run"


def test_the_command_is_the_pure_builders_argv() -> None:
    c = cfg("config-firecracker-tap.json")
    paths = RuntimePaths(c.runtime_dir)
    made = vmm.for_config(c, paths)
    assert made.command("/usr/bin/firecracker", "kvm") == firecracker.build_argv(c, "/usr/bin/firecracker", paths)


class _Base:
    """A minimal adapter shape: every Protocol method, no capability method."""

    console_on_stdout = False

    def resolve(self) -> str: return "/bin/true"
    def decide_accel(self, binary: str) -> str: return "kvm"
    def prepare_files(self) -> None: pass
    def prepare_sandbox(self, binary: str) -> None: pass
    def command(self, binary: str, accel: str) -> list[str]: return [binary]
    def attach(self, alive: Any) -> None: pass
    def event_fds(self) -> list[int]: return []
    def poll_events(self) -> None: pass
    def request_stop(self) -> str: return "test"
    def cleanup(self) -> None: pass


@pytest.fixture
def serial_console(monkeypatch: pytest.MonkeyPatch) -> Capability:
    """A capability the run performs (as a serial console socket will be), added for the test."""
    cap = Capability("serialConsole", "serialConsole", method="attach_serial_console")
    monkeypatch.setitem(capability.CAPABILITIES, cap.name, cap)  # type: ignore[index]
    return cap


def test_a_vmm_has_a_performed_capability_by_its_method_and_lacks_it_by_name(serial_console: Capability) -> None:
    class Has(_Base):
        profile = Profile("has", "has")

        def attach_serial_console(self, path: str) -> str:
            return f"console at {path}"

    class Lacks(_Base):
        profile = Profile("lacks", "lacks", lacks={"serialConsole": "no serial device"})

    assert vmm.conformance_problems(Has) == [] and vmm.conformance_problems(Lacks) == []
    assert vmm.capability_method(Has(), "serialConsole")("/run/c.sock") == "console at /run/c.sock"
    with pytest.raises(vmm.CapabilityMissing, match="lacks lacks capability serialConsole"):
        vmm.capability_method(Lacks(), "serialConsole")


def test_conformance_names_a_silent_lack_a_contradiction_and_a_missing_method(serial_console: Capability) -> None:
    class Silent(_Base):  # neither implements nor declares the lack: a call would do nothing, or fail at run time
        profile = Profile("silent", "silent")

    class Both(_Base):
        profile = Profile("both", "both", lacks={"serialConsole": ""})

        def attach_serial_console(self, path: str) -> None:
            pass

    class Broken(_Base):
        profile = Profile("broken", "broken", lacks={"teleport": ""})
        request_stop = None  # type: ignore[assignment]

    assert vmm.conformance_problems(Silent) == [
        "Silent: has serialConsole (not in profile.lacks) but no method attach_serial_console"]
    assert vmm.conformance_problems(Both) == ["Both: lacks serialConsole but defines attach_serial_console"]
    assert vmm.conformance_problems(Broken) == [
        "Broken: no method request_stop", "Broken: profile.lacks names 'teleport', which is not a capability",
        "Broken: has serialConsole (not in profile.lacks) but no method attach_serial_console"]
    assert vmm.conformance_problems(type("NoProfile", (_Base,), {})) == [
        "NoProfile: profile is not a capability.Profile"]
    with pytest.raises(vmm.CapabilityMissing, match="silent lacks capability serialConsole"):
        vmm.capability_method(Silent(), "serialConsole")


def test_capability_method_refuses_a_capability_without_a_method() -> None:
    with pytest.raises(ValueError, match="'rbd' is not a capability with a method"):
        vmm.capability_method(vmm.for_config(cfg("config-qemu-tap.json"), RuntimePaths("/run/x")), "rbd")


def test_find_executable_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "qemu"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert vmm.find_executable(str(exe), "ignored", "hypervisor.binary") == str(exe)
    exe.chmod(0o644)
    with pytest.raises(vmm.RunFailed, match=f"^hypervisor.binary: {exe} is not an executable file$") as failed:
        vmm.find_executable(str(exe), "ignored", "hypervisor.binary")
    assert failed.value.reason == "HypervisorMissing"
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(vmm.RunFailed, match=r"^jailer not found in PATH \(.*\); install it or set "
                                            r"hypervisor.jailer.binary$"):
        vmm.find_executable(None, "jailer", "hypervisor.jailer.binary")


# -- the adapters' stop requests and events against real sockets -------------------------------------------------

def test_qemu_stop_goes_through_qmp_and_its_events_fill_observed(tmp_path: Path) -> None:
    from tests.unit.launcher.test_protocols import fake_qmp_server

    c = cfg("config-qemu-tap.json")
    made = QemuVmm(c, RuntimePaths(str(tmp_path)))
    with pytest.raises(vmm.StopUnavailable, match=r"^graceful stop impossible without QMP; waiting for the stop "
                                                  r"timeout$"):
        made.request_stop()  # not attached: no QMP
    fake_qmp_server(str(tmp_path / "qmp.sock"), [
        b'{"event": "POWERDOWN", "data": {}}', b'{"event": "SHUTDOWN", "data": {"guest": true, "reason": '
                                               b'"guest-shutdown"}}'])
    made.attach(lambda: True)
    assert made.event_fds() == [made.qmp.fileno()]  # type: ignore[union-attr]
    assert made.request_stop() == "QMP system_powerdown"
    made.poll_events()  # the events that came with the reply
    assert made.observed == vmm.Observed(shutdown_reason="guest-shutdown", guest_panicked=False)
    made.cleanup()
    assert made.event_fds() == [], "closed QMP is not waited on"
    with pytest.raises(vmm.StopUnavailable):
        made.request_stop()


def test_qemu_stop_that_qmp_refuses_is_a_failed_stop(tmp_path: Path) -> None:
    import socket
    import threading

    path = str(tmp_path / "qmp.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.write(b'{"QMP": {"version": {}, "capabilities": []}}\r\n')
        f.flush()
        f.readline()
        f.write(b'{"return": {}}\r\n')
        f.flush()
        f.readline()
        f.write(b'{"error": {"class": "GenericError", "desc": "not now"}}\r\n')
        f.flush()

    threading.Thread(target=serve, daemon=True).start()
    made = QemuVmm(cfg("config-qemu-tap.json"), RuntimePaths(str(tmp_path)))
    made.attach(lambda: True)
    with pytest.raises(vmm.StopFailed, match="not now"):
        made.request_stop()
    made.cleanup()
    srv.close()


def test_firecracker_stop_before_the_api_listens_is_retried_and_a_broken_api_fails(tmp_path: Path) -> None:
    import socket
    import threading

    c = cfg("config-firecracker-tap.json")
    made = FirecrackerVmm(c, RuntimePaths(str(tmp_path)))
    with pytest.raises(vmm.StopRetry) as retry:
        made.request_stop()  # no socket yet
    assert retry.value.seconds == 0.05
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(tmp_path / "firecracker.sock"))  # bound, not listening: refused, retried
    with pytest.raises(vmm.StopRetry):
        made.request_stop()
    bound.listen(1)

    def hang_up() -> None:  # accepts, answers nothing, closes (a reset or an empty response: either fails)
        conn, _ = bound.accept()
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    with pytest.raises(vmm.StopFailed, match=r"^PUT /actions: "):
        made.request_stop()
    bound.close()
    made.poll_events()
    assert made.observed == vmm.Observed() and made.event_fds() == []
