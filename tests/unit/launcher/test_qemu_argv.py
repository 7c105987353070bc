"""QEMU command line generation (pure): accel, disks and cache modes, RBD without secrets, networks, QMP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import config, qemu
from zjusct_launcher.paths import RuntimePaths

EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def cfg(name: str = "config-qemu-tap.json", **top: Any) -> config.LauncherConfig:
    doc = json.loads((EXAMPLES / name).read_text())
    doc.update(top)
    return config.parse(doc)


def argv(c: config.LauncherConfig, accel: str = "tcg", blk: bool = False) -> list[str]:
    return qemu.build_argv(c, "/usr/bin/qemu-system-x86_64", accel, RuntimePaths(c.runtime_dir), blk)


def after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def blockdevs(args: list[str]) -> dict[str, dict[str, Any]]:
    return {d["node-name"]: d for d in map(json.loads, after(args, "-blockdev"))}


def test_tcg_uses_translation_cache_size_and_the_tcg_cpu_model() -> None:
    a = argv(cfg())
    assert after(a, "-accel") == ["tcg,tb-size=256"] and after(a, "-cpu") == ["qemu64,+rdrand"]
    assert after(a, "-M") == ["q35,sata=off,smbus=off,i8042=off,vmport=off"]
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["hypervisor"]["tcgCPUModel"] = "max"
    assert after(argv(config.parse(doc)), "-cpu") == ["max"]
    assert after(argv(config.parse(doc), accel="kvm"), "-cpu") == ["host"]  # the model is TCG's only


def test_kvm_uses_cpu_host() -> None:
    a = argv(cfg(), accel="kvm")
    assert after(a, "-accel") == ["kvm"] and after(a, "-cpu") == ["host"]


def test_machine_boot_console_qmp_and_lifecycle_flags() -> None:
    c = cfg()
    a = argv(c)
    assert after(a, "-smp") == ["1"] and after(a, "-m") == ["512M"]
    for flag in ("-nodefaults", "-no-user-config", "-no-reboot"):
        assert flag in a
    assert after(a, "-display") == ["none"]
    assert after(a, "-action") == ["panic=shutdown"] and "pvpanic" in after(a, "-device")
    assert after(a, "-kernel") == [c.boot.kernel] and after(a, "-initrd") == [c.boot.initrd]
    assert after(a, "-append") == [c.boot.cmdline]
    assert after(a, "-qmp") == [f"unix:{c.runtime_dir}/qmp.sock,server=on,wait=off"]
    assert after(a, "-chardev") == [f"file,id=serial0,path={c.serial_log_path},append=on"]
    assert after(a, "-serial") == ["chardev:serial0"]


@pytest.mark.parametrize(("mode", "direct"), [("Writeback", False), ("None", True)])
def test_root_disk_cache_honours_flushes_and_is_never_unsafe(mode: str, direct: bool) -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["rootDisk"]["cache"] = mode
    bd = blockdevs(argv(config.parse(doc)))
    root = bd["root"]
    assert root["cache"] == {"direct": direct, "no-flush": False}
    assert root["file"] == {"driver": "file", "filename": doc["rootDisk"]["path"],
                            "cache": {"direct": direct, "no-flush": False}}


def test_root_disk_format_is_the_blockdev_format_driver() -> None:
    assert blockdevs(argv(cfg()))["root"]["driver"] == "raw"
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["rootDisk"]["format"] = "qcow2"
    root = blockdevs(argv(config.parse(doc)))["root"]
    assert root["driver"] == "qcow2" and "backing" not in root  # QEMU opens the header's backing file itself
    assert root["file"]["driver"] == "file"


def test_block_device_root_uses_host_device_driver() -> None:
    assert blockdevs(argv(cfg(), blk=True))["root"]["file"]["driver"] == "host_device"


def test_disk_order_root_is_vda_identity_is_vdb_read_only() -> None:
    c = cfg()
    a = argv(c)
    devices = [d for d in after(a, "-device") if d.startswith("virtio-blk-pci")]
    assert devices == ["virtio-blk-pci,drive=root,bus=pcie.0,addr=0x3",
                       "virtio-blk-pci,drive=identity,bus=pcie.0,addr=0x4"]
    ident = blockdevs(a)["identity"]
    assert ident["read-only"] is True and ident["file"]["filename"] == f"{c.runtime_dir}/identity.tar"


def test_io_limits_start_qemu_paused_with_a_named_root_device_and_the_qmp_throttle_of_its_block_backend() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["rootDisk"]["ioLimits"] = {"readBytesPerSecond": 8388608, "writeBytesPerSecond": 4194304,
                                   "readIOPS": 500, "writeIOPS": 200}
    c = config.parse(doc)
    a = argv(c)
    assert "-S" in a and "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x3,id=root-disk" in after(a, "-device")
    assert not [o for o in after(a, "-object") if "throttle" in o]  # no filter node: it would throttle discards
    assert qemu.io_throttle(c.root_disk.io_limits) == {
        "id": "/machine/peripheral/root-disk/virtio-backend", "bps": 0, "bps_rd": 8388608, "bps_wr": 4194304,
        "iops": 0, "iops_rd": 500, "iops_wr": 200}
    doc["rootDisk"]["ioLimits"] = {"writeIOPS": 200}  # only the limits given; 0 is "none" to QMP
    assert qemu.io_throttle(config.parse(doc).root_disk.io_limits) == {
        "id": "/machine/peripheral/root-disk/virtio-backend", "bps": 0, "bps_rd": 0, "bps_wr": 0, "iops": 0,
        "iops_rd": 0, "iops_wr": 200}
    plain = argv(cfg())
    assert "-S" not in plain and qemu.io_throttle(cfg().root_disk.io_limits) is None  # none without limits


def test_rbd_root_uses_librbd_with_a_secret_object_file_never_the_key() -> None:
    c = cfg("config-qemu-rbd.json")
    a = argv(c)
    root = blockdevs(a)["root"]["file"]
    assert root == {"driver": "rbd", "pool": "rbd", "image": "vm-alice", "conf": "/etc/ceph/ceph.conf",
                    "user": "admin", "cache": {"direct": False, "no-flush": False},
                    "key-secret": "rbdkey0", "auth-client-required": ["cephx"]}
    assert after(a, "-object") == [f"secret,id=rbdkey0,file={c.runtime_dir}/rbd.secret,format=base64"]
    assert not any("AQ" in x and "key" in x.lower() and "secret" not in x for x in a)


def test_rbd_without_keyring_relies_on_ceph_conf() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-rbd.json").read_text())
    del doc["rootDisk"]["rbd"]["keyringPath"]
    a = argv(config.parse(doc))
    assert "key-secret" not in blockdevs(a)["root"]["file"] and "-object" not in a


def test_keyring_key_extraction() -> None:
    text = "[client.other]\n\tkey = AQBother==\n[client.admin]\n\tkey = AQBadminKey==\n\tcaps mon = \"allow *\"\n"
    assert qemu.keyring_key(text, "admin") == "AQBadminKey=="
    with pytest.raises(ValueError, match=r"\[client.nobody\]") as info:
        qemu.keyring_key(text, "nobody")
    assert "AQB" not in str(info.value)


def test_tap_network_uses_the_given_tap_and_mac() -> None:
    a = argv(cfg())
    assert after(a, "-netdev") == ["tap,id=net0,ifname=zjt6f1c2a9e,script=no,downscript=no"]
    assert "virtio-net-pci,netdev=net0,bus=pcie.0,addr=0x5,mac=52:54:00:12:34:56" in after(a, "-device")


def test_user_network_forwards_ssh_on_loopback_only() -> None:
    a = argv(cfg("config-qemu-user.json"))
    assert after(a, "-netdev") == ["user,id=net0,hostfwd=tcp:127.0.0.1:2222-:22"]


def test_network_none_has_no_nic() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["network"] = {"mode": "none"}
    doc.pop("readiness")
    a = argv(config.parse(doc))
    assert "-netdev" not in a and not any(d.startswith("virtio-net") for d in after(a, "-device"))


def test_commas_in_paths_are_escaped_for_qemu_opts() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["serialLogPath"] = "/var/log/a,b.log"
    a = argv(config.parse(doc))
    assert after(a, "-chardev") == ["file,id=serial0,path=/var/log/a,,b.log,append=on"]


def test_seccomp_by_default_denies_privilege_changes_too() -> None:
    a = argv(cfg())
    assert after(a, "-sandbox") == ["on,obsolete=deny,spawn=deny,resourcecontrol=deny,elevateprivileges=deny"]
    assert "-runas" not in a


def test_run_as_drops_to_the_numeric_pair_and_keeps_setuid_allowed_for_the_drop() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["hypervisor"]["runAs"] = {"uid": 1610612741, "gid": 1610612742}
    a = argv(config.parse(doc))
    assert after(a, "-runas") == ["1610612741:1610612742"]
    # elevateprivileges=deny would kill QEMU 7.2 with SIGSYS at the drop
    assert after(a, "-sandbox") == ["on,obsolete=deny,spawn=deny,resourcecontrol=deny"]
    assert "script=no" in after(a, "-netdev")[0], "spawn=deny: no ifup scripts"


def test_seccomp_off_leaves_no_sandbox_flag() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["hypervisor"]["seccomp"] = False
    assert "-sandbox" not in argv(config.parse(doc))


def test_a_root_size_starts_qemu_paused_and_only_a_smaller_disk_is_resized() -> None:
    doc = json.loads((EXAMPLES / "config-qemu-tap.json").read_text())
    doc["rootDisk"]["sizeMiB"] = 8
    c = config.parse(doc)
    assert qemu.paused_start(c) and "-S" in argv(c)
    assert not qemu.paused_start(cfg()) and "-S" not in argv(cfg())
    blocks = [{"device": "", "inserted": {"node-name": "identity", "image": {"virtual-size": 10240}}},
              {"device": "", "inserted": {"node-name": "root", "image": {"virtual-size": 4 << 20}}}]
    assert qemu.root_resize(blocks, 8) == (4 << 20, {"node-name": "root", "size": 8 << 20})
    assert qemu.root_resize(blocks, 4) == (4 << 20, None)  # already that size
    assert qemu.root_resize(blocks, 2) == (4 << 20, None)  # never shrunk
    with pytest.raises(ValueError, match="no root disk"):
        qemu.root_resize(blocks[:1], 8)
    with pytest.raises(ValueError, match="no virtual-size"):
        qemu.root_resize([{"inserted": {"node-name": "root", "image": {}}}], 8)
