"""Verify of the Molecule scenario ``images``: what roles/launcher_image and roles/controller_image promise (their
READMEs and meta/argument_specs.yml), for both roles with their defaults except the containerd socket.

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``; the one host is this
machine with ``ansible_connection: local``, so ``host.run`` runs here). containerd is the scenario's throwaway one
(socket in the ephemeral directory); the archives are in the machine's build cache (the roles' default cache
directories). The roles' result facts (``launcher_image_result``, ``controller_image_result``) are the ones
converge.yml recorded in ``results.json``. The archives' layers are read with :mod:`tarfile` (no extraction).
Each test reads the live state; none depends on another.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SOCK = EPHEMERAL / "containerd" / "containerd.sock"
RESULTS = EPHEMERAL / "results.json"
KINDS = ("launcher", "controller")
# the image directories holding this checkout's code
LAUNCHER_PKG = "usr/lib/python3/dist-packages/zjusct_launcher/"
CONTROLLER_LIB = "opt/zjusct-controller/lib/"
MODULE_UTILS = "ansible_collections/zjusct/cloud/plugins/module_utils/"
PACKAGES = (LAUNCHER_PKG, CONTROLLER_LIB + "zjusct_controller/", CONTROLLER_LIB + MODULE_UTILS)


def defaults(kind: str) -> dict[str, Any]:
    """roles/<kind>_image/defaults/main.yml (the scenario sets none of the variables read here)."""
    loaded: dict[str, Any] = yaml.safe_load((REPO / "roles" / f"{kind}_image" / "defaults" / "main.yml").read_text())
    return loaded


def collection_version() -> str:
    """galaxy.yml's version, the images' tag."""
    return str(yaml.safe_load((REPO / "galaxy.yml").read_text())["version"])


def result(kind: str) -> dict[str, str]:
    """The role's ``<kind>_image_result`` fact as converge.yml recorded it."""
    recorded: dict[str, str] = json.loads(RESULTS.read_text())[kind]
    return recorded


@functools.cache
def archive(path: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, str], set[str]]:
    """A docker-archive's manifest entry (the only one), its image config, ``{layer entry: sha256}`` of the regular
    files under the package directories the tests compare, and the names of all the layer's entries."""
    with tarfile.open(path) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert len(manifest) == 1, manifest
        config = json.load(outer.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        assert len(manifest[0]["Layers"]) == 1, manifest
        layer = outer.extractfile(manifest[0]["Layers"][0])
        assert layer is not None
        files: dict[str, str] = {}
        names: set[str] = set()
        with tarfile.open(fileobj=layer, mode="r:") as inner:
            for info in inner:
                name = info.name.removeprefix("./")
                names.add(name)
                if info.isreg() and name.startswith(PACKAGES):
                    f = inner.extractfile(info)
                    assert f is not None
                    files[name] = hashlib.sha256(f.read()).hexdigest()
    return manifest[0], config, files, names


def tree(directory: Path, patterns: tuple[str, ...] = ("*.py",)) -> dict[str, str]:
    """``{path relative to directory: sha256}`` of this checkout's files matching ``patterns``."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for pattern in patterns for p in sorted(directory.glob(pattern))}


def ctr(host, *args: str) -> str:
    """``ctr -n k8s.io ARGS`` on the scenario's containerd; its stdout (fails the test on a non-zero exit)."""
    out = host.run("ctr --address %s -n k8s.io " + " ".join(["%s"] * len(args)), str(SOCK), *args)
    assert out.rc == 0, out.stderr
    return str(out.stdout)


@pytest.mark.parametrize("kind", KINDS)
def test_result_fact(kind: str) -> None:
    """``tag`` is ``<name>:<collection version>``, ``key_tag`` adds the key's first 16 hex digits, the archive is
    ``<cache dir>/<key16>/<kind>.tar``."""
    d, r = defaults(kind), result(kind)
    assert d[f"{kind}_image_version"] == collection_version()
    assert r["tag"] == f"{d[f'{kind}_image_name']}:{collection_version()}"
    assert re.fullmatch(r"[0-9a-f]{64}", r["key"]), r["key"]
    assert r["key_tag"] == f"{r['tag']}-{r['key'][:16]}"
    assert r["archive"] == f"{d[f'{kind}_image_cache_dir']}/{r['key'][:16]}/{kind}.tar"


@pytest.mark.parametrize("kind", KINDS)
def test_archive_names_both_tags(host, kind: str) -> None:
    """A one-layer docker-archive whose manifest (and legacy ``repositories``) names both tags; its config's labels
    carry the version and the full key."""
    r = result(kind)
    assert host.file(r["archive"]).is_file
    entry, config = archive(r["archive"])[:2]
    assert entry["RepoTags"] == [r["tag"], r["key_tag"]]
    name, version = r["tag"].rsplit(":", 1)
    with tarfile.open(r["archive"]) as outer:
        repositories = json.load(outer.extractfile("repositories"))  # type: ignore[arg-type]
    assert set(repositories[name]) == {version, r["key_tag"].rsplit(":", 1)[1]}
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels[f"cloud.zjusct.io/{kind}-image-key"] == r["key"]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + entry["Layers"][0].split("/")[0]]


@pytest.mark.parametrize("kind", KINDS)
def test_containerd_has_both_tags_of_this_archive(host, kind: str) -> None:
    """``ctr -n k8s.io images ls`` on the throwaway containerd lists both tags, for one manifest whose config is
    the archive's (the image imported is this build, not another one of the same version)."""
    r = result(kind)
    refs = {}
    for line in ctr(host, "images", "ls").splitlines()[1:]:
        ref, _type, digest = line.split()[:3]
        refs[ref] = digest
    assert r["tag"] in refs and r["key_tag"] in refs, sorted(refs)
    assert refs[r["tag"]] == refs[r["key_tag"]]
    manifest = json.loads(ctr(host, "content", "get", refs[r["tag"]]))
    entry = archive(r["archive"])[0]
    assert manifest["config"]["digest"] == "sha256:" + entry["Config"].removesuffix(".json")


@pytest.mark.parametrize(("kind", "cmd"), [("launcher", ["version"]), ("controller", ["--help"])])
def test_entrypoint(host, kind: str, cmd: list[str]) -> None:
    """The imported image's config (read back from containerd): entrypoint ``python3 -m zjusct_<kind>``; the
    controller's ``PYTHONPATH`` is its library directory."""
    config_name = archive(result(kind)["archive"])[0]["Config"]
    config = json.loads(ctr(host, "content", "get", "sha256:" + config_name.removesuffix(".json")))["config"]
    assert config["Entrypoint"] == ["python3", "-m", f"zjusct_{kind}"]
    assert config["Cmd"] == cmd
    if kind == "controller":
        assert "PYTHONPATH=/opt/zjusct-controller/lib" in config["Env"], config["Env"]


def test_launcher_image_holds_this_trees_launcher() -> None:
    """``usr/lib/python3/dist-packages/zjusct_launcher`` is this checkout's package, file for file (no file of an
    earlier build left over), next to Python 3, QEMU, ip and nft from the base root."""
    files, names = archive(result("launcher")["archive"])[2:]
    image = {name.removeprefix(LAUNCHER_PKG): sha for name, sha in files.items() if name.startswith(LAUNCHER_PKG)}
    assert image == tree(REPO / "launcher" / "zjusct_launcher", ("*.py", "schemas/*.json"))
    for name in ("usr/bin/python3", "usr/bin/qemu-system-x86_64", "usr/sbin/nft", "usr/bin/ip"):
        assert name in names, f"{name} not in the launcher image"


def test_controller_image_holds_this_trees_controller() -> None:
    """``/opt/zjusct-controller/lib`` holds this checkout's ``zjusct_controller`` and ``plugins/module_utils``
    file for file, and kopf, kubernetes and prometheus-client; the base root is the controller's own (Python 3 of
    ``controller_image_python_version``, the ``rbd`` and ``ceph`` commands of fencing), not the launcher's (no QEMU,
    no launcher package)."""
    files, names = archive(result("controller")["archive"])[2:]
    for inside, local, patterns in (("zjusct_controller/", REPO / "controller" / "zjusct_controller", ("*.py",)),
                                    (MODULE_UTILS, REPO / "plugins" / "module_utils", ("*.py", "*/*.py"))):
        prefix = CONTROLLER_LIB + inside
        image = {name.removeprefix(prefix): sha for name, sha in files.items() if name.startswith(prefix)}
        assert image == tree(local, patterns), inside
    for name in ("kopf/__init__.py", "kubernetes/__init__.py", "prometheus_client/__init__.py"):
        assert CONTROLLER_LIB + name in names, f"{name} not in the controller image"
    python = "usr/bin/python" + defaults("controller")["controller_image_python_version"]
    for name in (python, "usr/bin/rbd", "usr/bin/ceph"):
        assert name in names, f"{name} not in the controller image"
    for name in ("usr/bin/qemu-system-x86_64", LAUNCHER_PKG.rstrip("/")):
        assert name not in names, f"{name} in the controller image: built from the launcher's base root"
