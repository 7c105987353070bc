"""Firecracker's pure half (firecracker.py): config document per the API fields, argv (direct and jailed),
exit meanings. The API client is tests/unit/launcher/test_firecracker_api.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import config, firecracker
from zjusct_launcher.paths import RuntimePaths

EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def cfg() -> config.LauncherConfig:
    return config.parse(json.loads((EXAMPLES / "config-firecracker-tap.json").read_text()))


def test_config_document_uses_the_documented_fields() -> None:
    c = cfg()
    doc = firecracker.build_config(c, RuntimePaths(c.runtime_dir))
    assert set(doc) == {"boot-source", "drives", "machine-config", "network-interfaces"}
    assert doc["boot-source"]["kernel_image_path"].endswith("/vmlinux")
    assert doc["boot-source"]["initrd_path"] == c.boot.initrd
    assert doc["boot-source"]["boot_args"].startswith(c.boot.cmdline + " reboot=k pci=off")
    root, ident = doc["drives"]
    assert root == {"drive_id": "rootfs", "path_on_host": c.root_disk.path, "is_root_device": True,
                    "is_read_only": False, "cache_type": "Writeback"}
    assert ident["is_read_only"] is True and ident["is_root_device"] is False
    assert ident["path_on_host"] == f"{c.runtime_dir}/identity.tar"
    assert all(d["cache_type"] == "Writeback" for d in doc["drives"]), "never Unsafe"
    assert doc["network-interfaces"] == [{"iface_id": "eth0", "guest_mac": "52:54:00:12:34:56",
                                          "host_dev_name": "zjt6f1c2a9e"}]
    assert doc["machine-config"] == {"vcpu_count": 1, "mem_size_mib": 512, "smt": False}


def test_io_limits_become_the_root_drive_rate_limiter_at_the_smaller_of_read_and_write() -> None:
    doc = json.loads((EXAMPLES / "config-firecracker-tap.json").read_text())
    doc["rootDisk"]["ioLimits"] = {"readBytesPerSecond": 8388608, "writeBytesPerSecond": 4194304, "readIOPS": 500}
    c = config.parse(doc)
    root, ident = firecracker.build_config(c, RuntimePaths(c.runtime_dir))["drives"]
    assert root["rate_limiter"] == {"bandwidth": {"size": 4194304, "refill_time": 1000},
                                    "ops": {"size": 500, "refill_time": 1000}}
    assert "rate_limiter" not in ident
    assert "rate_limiter" not in firecracker.build_config(cfg(), RuntimePaths(cfg().runtime_dir))["drives"][0]


def test_argv_and_instance_id() -> None:
    c = cfg()
    a = firecracker.build_argv(c, "/usr/local/bin/firecracker", RuntimePaths(c.runtime_dir))
    assert a == ["/usr/local/bin/firecracker", "--api-sock", f"{c.runtime_dir}/firecracker.sock",
                 "--config-file", f"{c.runtime_dir}/firecracker.json", "--id", "default-alice"]


@pytest.mark.parametrize(("code", "meaning"), [(0, "ok"), (1, "generic error"), (3, "bad configuration"),
                                               (148, "bad syscall (seccomp)"), (150, "fatal signal")])
def test_exit_meanings(code: int, meaning: str) -> None:
    assert firecracker.describe_exit(code).startswith(meaning)


def jailed_cfg(**hyp: Any) -> config.LauncherConfig:
    doc = json.loads((EXAMPLES / "config-firecracker-tap.json").read_text())
    doc["hypervisor"].update({"runAs": {"uid": 1610612741, "gid": 1610612742},
                              "jailer": {"chrootBaseDir": "/var/lib/zjusct-cloud/jail"}, **hyp})
    doc["machine"]["vcpus"] = 2
    return config.parse(doc)


def test_jailer_argv_takes_uid_gid_chroot_and_cgroup_from_the_config() -> None:
    c = jailed_cfg()
    a = firecracker.build_jailer_argv(c, "/usr/bin/jailer", "/usr/bin/firecracker")
    sep = a.index("--")
    jail, fc = a[:sep], a[sep + 1:]
    assert jail == ["/usr/bin/jailer", "--id", "default-alice", "--exec-file", "/usr/bin/firecracker",
                    "--uid", "1610612741", "--gid", "1610612742", "--chroot-base-dir", "/var/lib/zjusct-cloud/jail",
                    "--cgroup-version", "2", "--cgroup", "cpu.max=200000 100000"]
    assert fc == ["--api-sock", "/run/firecracker.socket", "--config-file", "/firecracker.json"]
    assert firecracker.jail_root(c, "/usr/bin/firecracker") == \
        "/var/lib/zjusct-cloud/jail/firecracker/default-alice/root"
    no_seccomp = firecracker.build_jailer_argv(jailed_cfg(seccomp=False), "/usr/bin/jailer", "/usr/bin/firecracker")
    assert no_seccomp[-1] == "--no-seccomp"


def test_jailed_config_names_paths_inside_the_chroot() -> None:
    c = jailed_cfg()
    doc = firecracker.build_config(c, RuntimePaths(c.runtime_dir), jailed=True)
    assert doc["boot-source"]["kernel_image_path"] == "/vmlinux"
    assert doc["boot-source"]["initrd_path"] == "/initrd.img"
    assert [d["path_on_host"] for d in doc["drives"]] == ["/rootfs.raw", "/identity.tar"]


def test_a_firecracker_root_file_is_extended_sparse_to_its_size_and_never_shrunk(tmp_path: Path) -> None:
    from zjusct_launcher.vmm import RunFailed
    from zjusct_launcher.vmm_firecracker import grow_file

    disk = tmp_path / "root.raw"
    disk.write_bytes(b"data" * 1024)
    grow_file(str(disk), 2)
    assert disk.stat().st_size == 2 << 20 and disk.read_bytes()[:8] == b"datadata"
    assert disk.stat().st_blocks * 512 < 1 << 20  # sparse
    grow_file(str(disk), 1)
    assert disk.stat().st_size == 2 << 20
    grow_file(None, 4)  # an RBD disk (QEMU only) or no size: nothing to do
    with pytest.raises(RunFailed, match=r"rootDisk.sizeMiB: cannot grow .*missing.raw to 4 MiB"):
        grow_file(str(tmp_path / "missing.raw"), 4)
