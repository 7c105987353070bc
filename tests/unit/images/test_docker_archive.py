"""roles/launcher_image/files/docker_archive.py: the docker-archive layout containerd/docker load.

The import into a real containerd is exercised by every real-node test (tests/integration/k8s_node); here the
archive itself is checked member by member: digests that match the content, the manifest, the config's diff_id,
links, modes, skipped device nodes, reproducibility and the errors for bad input.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.cluster import archive_writer

REPO = Path(__file__).resolve().parents[3]
da = archive_writer()


def make_root(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
    tool = root / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    os.link(tool, root / "bin" / "tool-link")
    (root / "bin" / "sh").symlink_to("tool")
    (root / "etc" / "hostname").write_text("x\n")
    return root


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar}  # type: ignore[union-attr]


def test_archive_members_digests_and_manifest(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    out = tmp_path / "img.tar"
    info = da.write_archive(root, "localhost/zjusct/test:1.0", out, entrypoint=["/bin/sh"], cmd=["-c", "true"],
                            labels={"a": "b"})
    got = members(out)
    manifest = json.loads(got["manifest.json"])
    assert len(manifest) == 1 and manifest[0]["RepoTags"] == ["localhost/zjusct/test:1.0"]
    config_name, (layer_name,) = manifest[0]["Config"], manifest[0]["Layers"]
    config_bytes, layer = got[config_name], got[layer_name]
    assert config_name == hashlib.sha256(config_bytes).hexdigest() + ".json"
    assert info["config_digest"] == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.loads(config_bytes)
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]} and info["diff_id"] == diff_id
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Entrypoint"] == ["/bin/sh"] and config["config"]["Cmd"] == ["-c", "true"]
    assert config["config"]["Labels"] == {"a": "b"} and config["config"]["Env"][0].startswith("PATH=")
    assert json.loads(got["repositories"]) == {"localhost/zjusct/test": {"1.0": diff_id.split(":")[1]}}


def test_layer_keeps_modes_links_and_skips_devices(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    (root / "dev").mkdir()
    os.mknod(root / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    out = tmp_path / "img.tar"
    da.write_archive(root, "localhost/t:1", out)
    got = members(out)
    layer_name = json.loads(got["manifest.json"])[0]["Layers"][0]
    layer = tmp_path / "layer.tar"
    layer.write_bytes(got[layer_name])
    with tarfile.open(layer) as tar:
        entries = {m.name: m for m in tar}
    assert [n for n in entries if not n.startswith(("bin", "etc", "tmp", "dev"))] == []
    assert "dev" in entries and "dev/null" not in entries
    assert not any(n.startswith("./") for n in entries)
    assert entries["bin/tool"].mode & 0o777 == 0o755
    assert entries["tmp"].mode & 0o7777 == 0o1777
    assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "tool"
    assert entries["bin/tool-link"].islnk() and entries["bin/tool-link"].linkname == "bin/tool"
    names = list(entries)
    assert names.index("bin") < names.index("bin/tool")


def test_same_tree_same_bytes_with_mtime_clamp(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    da.write_archive(root, "localhost/t:1", a, mtime=1_700_000_000)
    os.utime(root / "etc" / "hostname", (2_000_000_000, 2_000_000_000))
    da.write_archive(root, "localhost/t:1", b, mtime=1_700_000_000)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("tag", ["Localhost/x:1", "localhost/x", "x:", "x:-bad", ""])
def test_bad_tag_is_refused_naming_it_and_nothing_is_written(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "img.tar"
    with pytest.raises(ValueError, match="tag"):
        da.write_archive(make_root(tmp_path / f"root{len(tag)}"), tag, out)
    assert not out.exists()


def test_missing_root_and_relative_workdir_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        da.write_archive(tmp_path / "nope", "localhost/t:1", tmp_path / "o.tar")
    with pytest.raises(ValueError, match="workdir 'rel' is not an absolute path"):
        da.write_archive(make_root(tmp_path / "r"), "localhost/t:1", tmp_path / "o.tar", workdir="rel")
    assert list(tmp_path.glob("*.tar")) == [] and list(tmp_path.glob(".docker-archive-*")) == []


def test_command_line_prints_the_digests_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    script = da.__file__
    ok = subprocess.run([sys.executable, script, "--root", str(root), "--tag", "localhost/t:2", "--out",
                         str(tmp_path / "o.tar"), "--entrypoint", '["/bin/sh"]'], capture_output=True, text=True,
                        check=True)
    assert json.loads(ok.stdout)["tag"] == "localhost/t:2"
    bad = subprocess.run([sys.executable, script, "--root", str(root), "--tag", "UPPER:1", "--out",
                          str(tmp_path / "p.tar")], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "UPPER:1" in bad.stderr


def test_launcher_image_version_is_the_collection_version() -> None:
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    defaults = yaml.safe_load((REPO / "roles" / "launcher_image" / "defaults" / "main.yml").read_text())
    assert defaults["launcher_image_version"] == galaxy["version"]


def test_several_tags_name_the_same_image(tmp_path: Path) -> None:
    out = tmp_path / "img.tar"
    info = da.write_archive(make_root(tmp_path / "root"), ["localhost/x:1.0", "localhost/x:1.0-abc"], out)
    got = members(out)
    assert json.loads(got["manifest.json"])[0]["RepoTags"] == ["localhost/x:1.0", "localhost/x:1.0-abc"]
    layer = info["diff_id"].split(":")[1]
    assert json.loads(got["repositories"]) == {"localhost/x": {"1.0": layer, "1.0-abc": layer}}
    assert info["tags"] == ["localhost/x:1.0", "localhost/x:1.0-abc"]


def test_overlay_adds_and_replaces_files_and_exclude_leaves_a_subtree_out(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    (root / "etc" / "drop").mkdir()
    (root / "etc" / "drop" / "x").write_text("x\n")
    overlay = tmp_path / "overlay"
    (overlay / "etc").mkdir(parents=True)
    (overlay / "etc" / "hostname").write_text("overlay\n")
    (overlay / "opt" / "lib").mkdir(parents=True)
    (overlay / "opt" / "lib" / "m.py").write_text("pass\n")
    out = tmp_path / "img.tar"
    da.write_archive(root, "localhost/zjusct/test:1.0", out, overlays=(overlay,), exclude=("etc/drop",))
    got = members(out)
    (layer_name,) = json.loads(got["manifest.json"])[0]["Layers"]
    with tarfile.open(fileobj=io.BytesIO(got[layer_name])) as layer:
        names = [m.name for m in layer]
        content = {m.name: layer.extractfile(m).read() for m in layer if m.isfile()}  # type: ignore[union-attr]
    assert content["etc/hostname"] == b"overlay\n" and content["opt/lib/m.py"] == b"pass\n"
    assert names.count("etc") == 1 and names.count("etc/hostname") == 1
    assert not [n for n in names if n.startswith("etc/drop")]
    assert names.index("opt") < names.index("opt/lib") < names.index("opt/lib/m.py")
    with pytest.raises(ValueError, match="missing"):
        da.write_archive(root, "localhost/zjusct/test:1.0", tmp_path / "b.tar", overlays=(tmp_path / "missing",))
