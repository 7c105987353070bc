"""Parts of tests.cluster.RealNode that need no kubelet: what it reports missing, the images it builds (real gcc,
real busybox-static, real docker-archives) and the teardown of an empty work dir. The node itself is tested in
tests/integration/k8s_node."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.cluster import RealNode, node_images
from tests.cluster._realnode import teardown


def test_missing_kubelet_is_named_with_the_build_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZJUSCT_CACHE", str(tmp_path))
    reason = RealNode.missing_reason()
    assert reason is not None
    assert "kubelet not built for kubernetes v1.35.4" in reason and "hack/build-k8s.sh" in reason


@pytest.mark.skipif(shutil.which("gcc") is None or not Path("/bin/busybox").exists(),
                    reason="needs gcc and busybox-static (hack/apt-packages.txt)")
def test_node_images_are_cached_docker_archives_with_a_static_pause(tmp_path: Path) -> None:
    first = node_images(tmp_path)
    again = node_images(tmp_path)
    assert first == again  # second call reuses the cache (same key, "done" marker)
    with tarfile.open(first["pause_archive"]) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        layer = tar.extractfile(manifest[0]["Layers"][0]).read()  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
    assert manifest[0]["RepoTags"] == [first["pause"]] and config["config"]["Entrypoint"] == ["/pause"]
    (tmp_path / "layer.tar").write_bytes(layer)
    with tarfile.open(tmp_path / "layer.tar") as lt:
        pause = lt.extractfile("pause").read()  # type: ignore[union-attr]
    assert pause[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in pause  # static: no dynamic loader
    with tarfile.open(first["busybox_archive"]) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        (tmp_path / "bb.tar").write_bytes(tar.extractfile(manifest[0]["Layers"][0]).read())  # type: ignore[union-attr]
    with tarfile.open(tmp_path / "bb.tar") as lt:
        names = {m.name: m for m in lt}
    assert names["bin/sh"].issym() and names["bin/sh"].linkname == "busybox" and "bin/busybox" in names


def test_teardown_of_a_node_that_never_started_removes_its_work_dir(tmp_path: Path) -> None:
    work = tmp_path / "node"
    (work / "containerd").mkdir(parents=True)
    assert teardown(work, {"pids": {}, "sysctls_before": {}, "host_paths_before": {}}) == []
    assert not work.exists()
