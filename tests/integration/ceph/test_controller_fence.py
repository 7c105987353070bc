"""The controller's fence adapter (controller/zjusct_controller/fence.py) against a real Ceph cluster: with its own
cephx identity of caps ``mon 'profile rbd' osd 'profile rbd pool=rbd'`` and a ceph.conf holding only the monitors,
it finds a live writer of an image (a real ``rbd bench`` holding the exclusive lock and a watch) among the
watchers and lock owners, blocklists exactly that client (``ceph osd blocklist ls``), the writer's I/O fails from
then on, and a new client takes the lock and writes. The whole path with a guest on a lost node is
tests/integration/k8s_node/test_controller_fencing.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef, Rbd

from tests.ceph import Cluster
from tests.cluster import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "controller"))
from zjusct_controller.config import CephConfig
from zjusct_controller.fence import Fencer

pytestmark = [pytest.mark.ceph]


def test_fence_blocklists_the_live_writer_only_and_a_new_client_then_writes(
        ceph_cluster: Cluster, rbd: Rbd, image_name: str, tmp_path: Path) -> None:
    ref = ImageRef("rbd", image_name)
    rbd.create(ref, size_mib=64)
    keyring = tmp_path / "fence.keyring"
    keyring.write_text(ceph_cluster.ceph("auth", "get-or-create", "client.zjusct-fence-test", "mon", "profile rbd",
                                         "osd", "profile rbd pool=rbd"))
    keyring.chmod(0o600)
    bench = ["rbd", "-c", str(ceph_cluster.conf), "bench", "--io-type", "write", "--io-size", "4096",
             "--io-threads", "1", "--io-pattern", "rand"]
    # the writer's errors go to a file, never to a pipe nobody reads: once fenced, librbd logs every failed
    # request and lock attempt, and a full pipe would block the writer in write(2) instead of letting it fail
    writer_err = tmp_path / "writer.stderr"
    with open(writer_err, "wb") as err:
        writer = subprocess.Popen([*bench, "--io-total", "100G", ref.spec], stdout=subprocess.DEVNULL, stderr=err,
                                  env=ceph_cluster.env())
    added: list[str] = []
    try:
        watchers = wait_for(lambda: rbd.status(ref), 60, "the writer watches the image")
        owner = wait_for(lambda: rbd.locks(ref), 60, "the writer owns the exclusive lock")
        ip = watchers[0]["address"].split(":")[0]
        fencer = Fencer(CephConfig(monitors=(ceph_cluster.mon_host,), user="unused", secret_name="unused",
                                   fence_user="zjusct-fence-test", fence_keyring=str(keyring)))
        # still writing when fenced: its failure below is the fence's doing
        assert writer.poll() is None, writer_err.read_text(errors="replace")[-2000:]
        added = fencer.fence({"pod": "web-boot-1", "uid": None, "node": "n1", "podIP": ip, "pool": "rbd",
                              "image": image_name})
        # exactly the writer's client (its watch and its lock are the same client address), not the whole IP
        assert added == sorted({w["address"] for w in watchers} | {lk["address"] for lk in owner}), (added, owner)
        assert not [a for a in added if a.endswith(":0/0")]
        listed = ceph_cluster.ceph("osd", "blocklist", "ls")
        assert all(a in listed for a in added), listed
        # the fenced writer's I/O fails: rbd bench ends with an error
        try:
            wait_for(lambda: writer.poll() is not None, 120, "the blocklisted writer fails")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; its stderr ends: {writer_err.read_text(errors='replace')[-2000:]}") from None
        assert writer.returncode != 0
        # a new client breaks the dead owner's lock and writes
        started = time.monotonic()
        subprocess.run([*bench, "--io-total", "1M", ref.spec], check=True, capture_output=True, timeout=180,
                       env=ceph_cluster.env())
        print(f"new writer done in {time.monotonic() - started:.1f} s")
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(30)
        for addr in added:  # the session's cluster is shared: leave no blocklist entry behind
            subprocess.run(["ceph", "-c", str(ceph_cluster.conf), "osd", "blocklist", "rm", addr],
                           capture_output=True, timeout=60, check=False, env=ceph_cluster.env())
