"""One LauncherConfig builder (model/launcher_config.py) for both backends: what the host reconciler and the
controller hand the launcher is built by the same function, carries the same guest identity, and is a document the
launcher itself accepts (its own parser, zjusct_launcher.config.parse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zjusct_launcher
import zjusct_launcher.config as launcher_config
from ansible_collections.zjusct.cloud.plugins.module_utils.host import reconciler
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.model import launcher_config as builder
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet
from zjusct_controller.config import Config
from zjusct_controller.pod import NET_SETUP
from zjusct_controller.pod import launcher_config as pod_launcher_config

VM = {"metadata": {"namespace": "default", "name": "web", "uid": "0f6c1e2a-7d3b-4c59-9a0e-4b8f2d1c3e5a"},
      "spec": {"owner": "alice", "rootVolumeClaim": "web-root", "vcpus": 2, "memoryMiB": 768, "powerState": "Running",
               "bootID": 3, "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm1uC8Zg7yF3 a@b"]}}


def _host_doc(tmp_path: Path) -> dict:
    image = tmp_path / "images" / "tiny-1"
    image.mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": "tiny", "defaultCmdline": "console=ttyS0"}))
    (tmp_path / "host.json").write_text(json.dumps({"state_dir": str(tmp_path / "state"), "netns": "",
                                                     "runtime_dir": str(tmp_path / "run"), "dns": ["192.0.2.53"]}))
    cfg = load(str(tmp_path / "host.json"))
    volume = {"name": "web-root", "driver": "file", "image": str(image), "location": str(tmp_path / "web-root.raw")}
    lease = {"tap": "zjt0123456789a", "mac": "52:54:00:12:34:56", "ipv4": "10.200.0.7"}
    return reconciler.launcher_config(cfg, VM, volume, lease, {"path": volume["location"], "cache": "Writeback"})


def test_both_backends_give_the_guest_the_same_identity_and_the_launcher_accepts_both(tmp_path: Path) -> None:
    host = _host_doc(tmp_path)
    pod = pod_launcher_config(VM, Config(launcher_image="localhost/zjusct/launcher:1", image_dir="/images",
                                         cmdline="console=ttyS0"))
    for doc in (host, pod):
        assert (doc["apiVersion"], doc["kind"]) == (zjusct_launcher.API_VERSION, "LauncherConfig")
        assert doc["identity"] == {"hostname": "web", "instanceID": VM["metadata"]["uid"],
                                   "sshAuthorizedKeys": VM["spec"]["sshAuthorizedKeys"]}
        assert doc["vm"] == {"namespace": "default", "name": "web", "uid": VM["metadata"]["uid"], "bootID": 3}
        assert doc["machine"] == {"vcpus": 2, "memoryMiB": 768}
        parsed = launcher_config.parse(doc)
        assert (parsed.identity.hostname, parsed.vm.boot_id) == ("web", 3)
    assert builder.API_VERSION == zjusct_launcher.API_VERSION
    # what differs is only what each backend places: paths, network, root disk
    assert host["network"]["createTap"] is False and pod["network"]["createTap"] is True
    assert pod["result"]["terminationMessagePath"] == "/dev/termination-log" and "readyMarkerPath" in host


def test_disk_io_limits_are_the_smaller_of_the_vms_and_the_operators_on_both_backends(tmp_path: Path) -> None:
    """spec.diskIO can only lower the operator's limits (model.disk_io.effective): each key takes the smaller of
    the two, or the one set; the launcher accepts the result as rootDisk.ioLimits."""
    vm = {**VM, "spec": {**VM["spec"], "diskIO": {"writeBytesPerSecond": 8388608, "readIOPS": 900}}}
    operator = {"writeBytesPerSecond": 4194304, "readIOPS": 1000, "writeIOPS": 300}
    image = tmp_path / "images" / "tiny-1"
    image.mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": "tiny", "defaultCmdline": "console=ttyS0"}))
    (tmp_path / "host.json").write_text(json.dumps({"state_dir": str(tmp_path / "state"), "netns": "",
                                                     "runtime_dir": str(tmp_path / "run"),
                                                     "disk_io_limits": operator}))
    cfg = load(str(tmp_path / "host.json"))
    volume = {"name": "web-root", "driver": "file", "image": str(image), "location": str(tmp_path / "web-root.raw")}
    lease = {"tap": "zjt0123456789a", "mac": "52:54:00:12:34:56", "ipv4": "10.200.0.7"}
    host = reconciler.launcher_config(cfg, vm, volume, lease, {"path": volume["location"], "cache": "Writeback"})
    pod = pod_launcher_config(vm, Config(launcher_image="localhost/zjusct/launcher:1", image_dir="/images",
                                         cmdline="console=ttyS0", disk_io_limits=operator))
    expected = {"writeBytesPerSecond": 4194304, "readIOPS": 900, "writeIOPS": 300}
    for doc in (host, pod):
        assert doc["rootDisk"]["ioLimits"] == expected
        assert launcher_config.parse(doc).root_disk.io_limits.write_iops == 300
    assert "ioLimits" not in _host_doc(tmp_path / "plain")["rootDisk"]  # neither limits: no field


def test_bad_operator_disk_io_limits_are_refused_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"disk_io_limits": {"writeIOPS": 5, "readBPS": 1}}))
    with pytest.raises(ValueError) as err:
        load(str(tmp_path / "host.json"))
    assert "disk_io_limits.writeIOPS: 5 is below the minimum 20" in str(err.value)
    assert "disk_io_limits.readBPS: unknown field" in str(err.value) and "hypervisor_disk_io_limits" in str(err.value)
    with pytest.raises(ValueError, match=r"diskIOLimits\.readIOPS: 10000001 is above the maximum 10000000"):
        Config.from_dict({"launcherImage": "x", "imageDir": "/i", "cmdline": "c",
                          "diskIOLimits": {"readIOPS": 10000001}})


def test_the_launcher_pods_nft_script_guards_exactly_the_tap_mac_and_address_its_launcher_config_gives() -> None:
    """The L2 guard in the launcher Pod's set-up (NET_SETUP) is the host backend's isolation table with elements
    for the guest the Pod's LauncherConfig describes: a renamed TAP or a changed address would leave the guest
    unguarded (the rules match TAPs by the zjt* prefix and drop what a TAP without elements sends)."""
    pod = pod_launcher_config(VM, Config(launcher_image="localhost/zjusct/launcher:1", image_dir="/images",
                                         cmdline="console=ttyS0"))
    net = pod["network"]
    assert net["tap"].startswith(hostnet.TAP_PREFIX) and net["bridge"] == "br0"
    guest = {"tap": net["tap"], "mac": net["mac"], "ipv4": net["ipv4"]}
    assert hostnet.isolation_script({"vm": [guest]}) in NET_SETUP
    elements = NET_SETUP.split(f"table bridge {hostnet.NFT_TABLE} {{", 1)[1]
    assert f'add element bridge {hostnet.NFT_TABLE} guest_ipv4 {{ "{net["tap"]}" . 10.0.3.2 }}' in elements
    assert NET_SETUP.index(hostnet.NFT_TABLE) < NET_SETUP.index("zjusct_launcher run")  # before the guest starts


def test_the_root_volume_size_reaches_the_launcher_as_the_root_disks_size_on_both_backends(tmp_path: Path) -> None:
    vm = {**VM, "spec": {**VM["spec"], "rootVolumeSizeMiB": 4096}}
    image = tmp_path / "images" / "tiny-1"
    image.mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": "tiny", "defaultCmdline": "console=ttyS0"}))
    (tmp_path / "host.json").write_text(json.dumps({"state_dir": str(tmp_path / "state"), "netns": "",
                                                     "runtime_dir": str(tmp_path / "run")}))
    volume = {"name": "web-root", "driver": "file", "image": str(image), "location": str(tmp_path / "web-root.raw")}
    lease = {"tap": "zjt0123456789a", "mac": "52:54:00:12:34:56", "ipv4": "10.200.0.7"}
    host = reconciler.launcher_config(load(str(tmp_path / "host.json")), vm, volume, lease,
                                      {"path": volume["location"], "cache": "Writeback"})
    pod = pod_launcher_config(vm, Config(launcher_image="localhost/zjusct/launcher:1", image_dir="/images",
                                         cmdline="console=ttyS0"))
    for doc in (host, pod):
        assert doc["rootDisk"]["sizeMiB"] == 4096
        assert launcher_config.parse(doc).root_disk.size_mib == 4096
    assert "sizeMiB" not in _host_doc(tmp_path / "plain")["rootDisk"]  # unset: the disk as it is
