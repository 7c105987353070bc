"""The host backend's volume driver seam (plugins/module_utils/storage/driver*.py): the registry, the protocol every
driver satisfies, the host config's choice, and the qcow2 driver on real files with the real ``qemu-img`` and
``qemu-io`` (no guest: the journey with real guests is tests/e2e/host/test_qcow2_volumes.py)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import driver as vd
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_qcow2 import base_path, image_info
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

MiB = 1024 * 1024
PROTOCOL = [name for name, _ in inspect.getmembers(vd.VolumeDriver, inspect.isfunction) if not name.startswith("_")]


def test_the_protocol_has_the_operations_the_host_backend_needs():
    assert sorted(PROTOCOL) == sorted(["check_config", "create", "claim", "release", "claim_mark", "writers",
                                       "boot_blocker", "delete", "root_disk", "describe", "backup_source",
                                       "restore_target"])


@pytest.mark.parametrize("name", vd.DRIVER_NAMES)
def test_every_registered_driver_implements_the_protocol_with_its_signatures(name):
    found = vd.driver(name)
    assert found.name == name
    for method in PROTOCOL:
        assert inspect.signature(getattr(type(found), method)) == inspect.signature(getattr(vd.VolumeDriver, method)), \
            f"{name}.{method}"
    assert sorted(vd.DRIVERS) == sorted(vd.DRIVER_NAMES)


def test_an_unknown_driver_names_the_field_and_the_allowed_ones():
    with pytest.raises(vd.UnknownDriver, match=r"^volume_driver: 'nfs' is not one of file, rbd, qcow2$"):
        vd.driver("nfs")
    with pytest.raises(vd.UnknownDriver, match=r"^volume 'x': driver: None is not one of"):
        vd.driver(None, "volume 'x': driver")


def write(tmp_path: Path, **data) -> str:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_the_host_config_chooses_qcow2_and_refuses_bad_values_naming_the_option(tmp_path):
    assert load(write(tmp_path, volume_driver="qcow2")).volume_driver == "qcow2"
    with pytest.raises(ValueError, match=r"host_config: volume_driver: 'qcow' is not one of file, rbd, qcow2"
                                         r" \(hypervisor_volume_driver\)"):
        load(write(tmp_path, volume_driver="qcow"))
    with pytest.raises(ValueError, match="volume_driver: 'qcow2' needs hypervisor qemu"):
        load(write(tmp_path, volume_driver="qcow2", hypervisor="firecracker"))


def test_the_role_offers_every_registered_driver():
    specs = (Path(__file__).resolve().parents[3] / "roles" / "hypervisor" / "meta" / "argument_specs.yml").read_text()
    line = next(x for x in specs.splitlines()[specs.splitlines().index("      hypervisor_volume_driver:"):]
                if "choices:" in x)
    assert line.split("choices:")[1].strip() == "[" + ", ".join(vd.DRIVER_NAMES) + "]"


@pytest.fixture
def image_set(tmp_path) -> dict:
    """A tiny image set: a 16 MiB raw rootfs with a known pattern in its first MiB."""
    directory = tmp_path / "images" / "tiny-1"
    directory.mkdir(parents=True)
    with open(directory / "rootfs.raw", "wb") as fh:
        fh.write(b"\xab" * MiB)
        fh.truncate(16 * MiB)
    return {"name": "tiny", "dir": str(directory)}


def qemu_io(path: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, path], capture_output=True, text=True,
                          check=False)


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_qcow2_overlays_share_a_read_only_base_and_are_independent(tmp_path, image_set):
    drv, settings = vd.driver("qcow2"), vd.VolumeSettings(volumes_dir=str(tmp_path / "volumes"))
    first = drv.create(settings, "a-root", image_set, "alice", None)
    second = drv.create(settings, "b-root", image_set, "bob", 32)
    base = base_path(settings.volumes_dir, image_set["dir"])
    assert first == {"location": str(tmp_path / "volumes" / "a-root.qcow2"), "size_mib": 16}
    assert second["size_mib"] == 32 and image_info(second["location"])["virtual-size"] == 32 * MiB
    for created in (first, second):
        info = image_info(created["location"])
        assert (info["format"], info["backing-filename"], info["backing-filename-format"]) == ("qcow2", base, "qcow2")
        assert os.stat(created["location"]).st_mode & 0o777 == 0o600
        assert os.path.getsize(created["location"]) < MiB  # a thin overlay, not a copy
    assert os.stat(base).st_mode & 0o777 == 0o444
    assert sorted(os.listdir(os.path.dirname(base))) == ["tiny-1.qcow2", "tiny-1.qcow2.lock"]  # converted once
    before = digest(base)
    # a write to one overlay is not seen by the other, nor by the base
    assert qemu_io(first["location"], "write -P 0x11 0 64k").returncode == 0
    assert qemu_io(first["location"], "read -P 0x11 0 64k").returncode == 0
    assert qemu_io(second["location"], "read -P 0xab 0 64k").returncode == 0
    assert "Pattern verification failed" in qemu_io(second["location"], "read -P 0x11 0 64k").stdout
    assert digest(base) == before
    # the launcher's root disk, and what host_volume_info adds
    record = {"name": "a-root", "driver": "qcow2", "image": image_set["dir"], **first}
    assert drv.root_disk(settings, record) == {"path": first["location"], "format": "qcow2", "cache": "Writeback"}
    assert drv.describe(settings, record) == {"base": base}
    assert drv.writers(settings, record) == [] and drv.boot_blocker(settings, record) is None
    # delete removes the overlay only
    drv.delete(settings, record)
    assert not os.path.exists(first["location"]) and digest(base) == before
    assert qemu_io(second["location"], "read -P 0xab 0 64k").returncode == 0
    drv.delete(settings, record)  # a second delete is no error


def test_qcow2_create_refuses_bad_input_and_leaves_nothing(tmp_path, image_set):
    drv, settings = vd.driver("qcow2"), vd.VolumeSettings(volumes_dir=str(tmp_path / "volumes"))
    with pytest.raises(VolumeError, match=r"^volume_size_mib: 8 is below the image's size 16$"):
        drv.create(settings, "a-root", image_set, "alice", 8)
    assert sorted(os.listdir(settings.volumes_dir)) == ["bases"]
    drv.create(settings, "a-root", image_set, "alice", None)
    with pytest.raises(VolumeError, match=r"^root_volume_claim: a volume file .*a-root.qcow2 already exists"):
        drv.create(settings, "a-root", image_set, "alice", None)
    with pytest.raises(VolumeError, match=r"^image: .*nothing has no rootfs.raw$"):
        drv.create(settings, "c-root", {"dir": str(tmp_path / "nothing")}, "carol", None)
    assert sorted(os.listdir(settings.volumes_dir)) == ["a-root.qcow2", "bases"]
