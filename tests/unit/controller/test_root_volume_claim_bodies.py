"""The PersistentVolume and claim zjusct.cloud.root_volume_claim creates are what the controller's ``rbd_root_disk``
reads (claim -> PV -> pool/image), so a VM started by vm_start on Kubernetes gets its RBD root disk."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import root_volume_claim_module as rvc
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef, MiB
from zjusct_controller.config import CephConfig, Config
from zjusct_controller.volume import rbd_root_disk

NS, CLAIM, PV = "alice", "web-root", "alice.web-root"


def test_the_controller_accepts_the_bodies() -> None:
    """What this module creates is what the controller's ``rbd_root_disk`` reads (claim -> PV -> pool/image)."""
    cfg = Config(launcher_image="l:1", image_dir="/srv/images", cmdline="c",
                 ceph=CephConfig(monitors=["10.0.0.1:6789"], user="vm", secret_name="ceph-vm"))
    claim = rvc.pvc_body(NS, CLAIM, PV, 8 * MiB, "alice")
    volume = rvc.pv_body(PV, NS, CLAIM, ImageRef("rbd", PV), 8 * MiB, "alice")
    got = rbd_root_disk(claim, volume, cfg)
    assert (got["pool"], got["image"], got["user"]) == ("rbd", PV, "vm")
