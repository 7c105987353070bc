"""The rbd volume driver's host-config keys and the launcher config the host backend renders for an rbd volume
(pure: no Ceph needed)."""

from __future__ import annotations

import json

import pytest
import zjusct_launcher.config as launcher_config
from ansible_collections.zjusct.cloud.plugins.module_utils.host import reconciler
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import rbd_clone as rv
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import driver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError


def write(tmp_path, **data) -> str:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_host_config_rejects_unknown_driver_and_rbd_without_pool(tmp_path):
    with pytest.raises(ValueError, match="volume_driver: 'nfs' is not one of file, rbd"):
        load(write(tmp_path, volume_driver="nfs"))
    with pytest.raises(ValueError, match=r"rbd\.pool: required when volume_driver is rbd"):
        load(write(tmp_path, volume_driver="rbd", rbd={"conf": "/etc/ceph/ceph.conf"}))
    cfg = load(write(tmp_path, volume_driver="rbd", rbd={"pool": "vms", "user": "cloud"}))
    assert (cfg.volume_driver, cfg.rbd["pool"]) == ("rbd", "vms")
    assert load(write(tmp_path)).volume_driver == "file"


def test_rbd_settings_name_unknown_keys_and_bad_pools():
    with pytest.raises(VolumeError, match="unknown keys keyring"):
        rv.settings({"pool": "rbd", "keyring": "/k"})
    with pytest.raises(VolumeError, match=r"rbd\.pool: .-x. is not a valid name"):
        rv.settings({"pool": "-x"})


def test_launcher_config_of_an_rbd_volume_is_valid_for_the_launcher(tmp_path):
    image = tmp_path / "img"
    image.mkdir()
    (image / "manifest.json").write_text(json.dumps({"defaultCmdline": "console=ttyS0 root=/dev/vda rw"}))
    conf, keyring = tmp_path / "ceph.conf", tmp_path / "keyring"
    for f in (conf, keyring, image / "vmlinuz", image / "initrd.img"):
        f.write_text("x")
    cfg = load(write(tmp_path, volume_driver="rbd", state_dir=str(tmp_path / "s"), runtime_dir=str(tmp_path / "r"),
                     log_dir=str(tmp_path / "l"),
                     rbd={"pool": "rbd", "conf": str(conf), "user": "cloud", "keyring_path": str(keyring)}))
    vm = {"metadata": {"namespace": "default", "name": "alice", "uid": "0b6f2a8e-1111-4222-8333-444455556666"},
          "spec": {"bootID": 1, "vcpus": 1, "memoryMiB": 512, "sshAuthorizedKeys": []}}
    volume = {"name": "alice-root", "driver": "rbd", "location": "rbd/alice-root", "image": str(image)}
    lease = {"tap": "zt0123456789", "mac": "52:54:00:12:34:56", "ipv4": "10.200.0.2"}
    root_disk = driver(volume["driver"]).root_disk(cfg.volume_settings(), volume)
    doc = reconciler.launcher_config(cfg, vm, volume, lease, root_disk)
    assert doc["rootDisk"] == {"rbd": {"pool": "rbd", "image": "alice-root", "user": "cloud", "conf": str(conf),
                                       "keyringPath": str(keyring)}, "cache": "Writeback"}
    parsed = launcher_config.parse(doc)
    assert parsed.root_disk.rbd is not None and parsed.root_disk.rbd.image == "alice-root"
    assert "bootSlots" not in doc
    assert parsed.hypervisor.tcg_cpu_model == "qemu64,+rdrand" == doc["hypervisor"]["tcgCPUModel"]
    slotted = load(write(tmp_path, **{**json.loads((tmp_path / "host.json").read_text()), "max_concurrent_boots": 3}))
    parsed = launcher_config.parse(reconciler.launcher_config(slotted, vm, volume, lease, root_disk))
    assert parsed.boot_slots == launcher_config.BootSlots("/run/lock/zjusct-cloud/boot-slots", 3)


def test_max_concurrent_boots_becomes_the_launchers_boot_slots_and_bad_values_are_named(tmp_path):
    assert load(write(tmp_path)).boot_slots() is None  # default 0: no limit, no bootSlots in the config
    cfg = load(write(tmp_path, max_concurrent_boots=2, boot_slot_dir="/run/lock/hv/slots"))
    assert cfg.boot_slots() == {"directory": "/run/lock/hv/slots", "count": 2}
    for bad, named in (({"max_concurrent_boots": -1}, "max_concurrent_boots: -1 is not 0"),
                       ({"max_concurrent_boots": 1025}, "max_concurrent_boots: 1025"),
                       ({"max_concurrent_boots": "2"}, "max_concurrent_boots: '2'"),
                       ({"boot_slot_dir": "slots"}, "boot_slot_dir: 'slots' is not a normalised absolute path"),
                       ({"boot_slot_dir": "/"}, "boot_slot_dir: '/' is not"),
                       ({"boot_slot_dir": "/run//lock"}, "boot_slot_dir: '/run//lock' is not"),
                       ({"boot_slot_dir": 7}, "boot_slot_dir: 7 is not"),
                       ({"tcg_cpu_model": "max -device x"}, "tcg_cpu_model: 'max -device x' is not a QEMU CPU"),
                       ({"tcg_cpu_model": ""}, "tcg_cpu_model: '' is not")):
        with pytest.raises(ValueError, match=named):
            load(write(tmp_path, **bad))
