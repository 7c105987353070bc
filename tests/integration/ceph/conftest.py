"""Fixtures for tests against a real single-node Ceph cluster (tests/ceph).

* ``ceph_cluster`` (session): mon + mgr + one bluestore OSD on a sparse file, pool ``rbd``; torn down (daemons
  stopped by pid, state dir removed) at the end of the session, also after failures.
* ``rbd``: an ``Rbd`` adapter (module_utils.storage.rbd) connected to it as client.admin.
* ``image_name``: a unique image name per test (all tests share the pool).
* ``watcher``: starts a real watcher (``rbd watch``) on an image and stops it at the end of the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd

from tests.ceph import Cluster, start_cluster
from tests.conftest import require


def _have_ceph() -> bool:
    return all(shutil.which(b) for b in ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd", "monmaptool"))


@pytest.fixture(scope="session")
def ceph_cluster() -> Iterator[Cluster]:
    require("ceph", _have_ceph(), "ceph-mon/mgr/osd and rbd not installed (hack/install-deps.sh)")
    cluster = start_cluster(timeout=180)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rbd(ceph_cluster: Cluster) -> Rbd:
    return Rbd(Connection(conf=str(ceph_cluster.conf), keyring=str(ceph_cluster.keyring), timeout=120))


@pytest.fixture
def image_name(request: pytest.FixtureRequest) -> str:
    return f"t-{request.node.name[:30].strip('_[]')}-{uuid.uuid4().hex[:6]}".replace("[", "-").replace("]", "")


@pytest.fixture
def watcher(ceph_cluster: Cluster) -> Iterator[Callable[[ImageRef], subprocess.Popen]]:
    """Start ``rbd watch`` on an image (a real watcher, like an open QEMU); wait until ``rbd status`` shows it."""
    procs: list[subprocess.Popen] = []

    def start(ref: ImageRef) -> subprocess.Popen:
        # rbd watch exits on EOF of stdin: keep a pipe open
        p = subprocess.Popen(["rbd", "-c", str(ceph_cluster.conf), "watch", ref.spec], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ceph_cluster.env())
        procs.append(p)
        r = Rbd(Connection(conf=str(ceph_cluster.conf)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if r.status(ref):
                return p
            time.sleep(0.1)
        raise AssertionError(f"rbd watch on {ref.spec} did not register a watcher within 30 s")

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def write_at(ceph_cluster: Cluster, ref: ImageRef, offset: int, data: bytes, tmp: str) -> None:
    """Write ``data`` at byte ``offset`` of an image (no krbd here: apply a snapshot-less rbd diff stream)."""
    import struct

    stream = b"rbd diff v1\n" + b"w" + struct.pack("<QQ", offset, len(data)) + data + b"e"
    path = os.path.join(tmp, f"w-{uuid.uuid4().hex[:8]}.rbdiff")
    with open(path, "wb") as f:
        f.write(stream)
    subprocess.run(["rbd", "-c", str(ceph_cluster.conf), "import-diff", "--no-progress", path, ref.spec],
                   check=True, timeout=120, capture_output=True, env=ceph_cluster.env())
    os.unlink(path)


def read_image(ceph_cluster: Cluster, ref: ImageRef, path: str) -> bytes:
    """The image's full content through ``rbd export``."""
    if os.path.exists(path):
        os.unlink(path)
    subprocess.run(["rbd", "-c", str(ceph_cluster.conf), "export", "--no-progress", ref.spec, path], check=True,
                   timeout=300, capture_output=True, env=ceph_cluster.env())
    with open(path, "rb") as f:
        return f.read()
