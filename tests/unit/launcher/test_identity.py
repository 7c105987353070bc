"""The config disk: a ustar archive with the four contract members, readable by tar, block-sized."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from zjusct_launcher import config, identity

EXAMPLES = Path(__file__).resolve().parents[3] / "launcher" / "examples"


def cfg(name: str = "config-qemu-tap.json", **net: object) -> config.LauncherConfig:
    doc = json.loads((EXAMPLES / name).read_text())
    doc["network"].update(net)
    doc["identity"]["sshAuthorizedKeys"].append("ssh-rsa AAAAB3NzaC1yc2E= second")
    return config.parse(doc)


def read(data: bytes) -> dict[str, tarfile.TarInfo | bytes]:
    out: dict[str, tarfile.TarInfo | bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            out[m.name] = m
            f = tar.extractfile(m)
            assert f is not None
            out[m.name + ":data"] = f.read()
    return out


def test_archive_is_ustar_block_sized_with_exactly_the_contract_members() -> None:
    data = identity.build(cfg())
    assert len(data) % 512 == 0
    assert data[257:263] == b"ustar\x00", "POSIX ustar magic"
    members = read(data)
    assert sorted(k for k in members if ":" not in k) == ["authorized_keys", "hostname", "instance-id", "network"]


def test_member_contents() -> None:
    c = cfg()
    m = read(identity.build(c))
    assert m["instance-id:data"] == b"6f1c2a9e-2b7d-4c1e-9a55-0d3b8f1e7c42\n"
    assert m["hostname:data"] == b"alice\n"
    keys = m["authorized_keys:data"].decode().splitlines()  # type: ignore[union-attr]
    assert keys[1] == "ssh-rsa AAAAB3NzaC1yc2E= second" and len(keys) == 2
    assert m["network:data"] == (b"MAC=52:54:00:12:34:56\nIPV4=10.200.0.5/24\nGATEWAY=10.200.0.1\n"
                                 b"DNS=10.200.0.1\n")
    info = m["authorized_keys"]
    assert isinstance(info, tarfile.TarInfo) and info.mode == 0o600


def test_user_mode_writes_the_slirp_addresses() -> None:
    m = read(identity.build(cfg("config-qemu-user.json")))
    assert b"IPV4=10.0.2.15/24\nGATEWAY=10.0.2.2\nDNS=10.0.2.3\n" in m["network:data"]  # type: ignore[operator]


def test_tap_without_ipv4_means_no_static_config() -> None:
    m = read(identity.build(cfg(ipv4=None, gateway=None, dns=[])))
    assert m["network:data"] == b"MAC=52:54:00:12:34:56\nIPV4=\nGATEWAY=\nDNS=\n"


def test_build_is_deterministic() -> None:
    assert identity.build(cfg()) == identity.build(cfg())
