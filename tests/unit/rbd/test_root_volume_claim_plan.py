"""root_volume_claim's pure decisions: names, bodies and the refusals of :func:`plan` (every field, all at once).

The same module against the real control plane and real Ceph: tests/integration/cloudvm_k8s/test_root_volume_claim.py.
"""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import root_volume_claim_module as rvc
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import CLAIMED_BY_MARK, DNS_LABEL_RULE
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import META_OWNER, ImageRef, MiB

NS, CLAIM, PV = "alice", "web-root", "alice.web-root"
IMAGE_SET = {"dir": "/images/debian-bookworm-1"}


def params(**over: object) -> dict:
    p = {"namespace": NS, "name": CLAIM, "owner": "alice", "pool": "rbd", "rbd_image": PV, "volume_name": PV,
         "size_mib": None}
    p.update(over)
    return p


def pv(owner: str = "alice", claim: tuple[str, str] = (NS, CLAIM), image: str = PV) -> dict:
    body = rvc.pv_body(PV, claim[0], claim[1], ImageRef("rbd", image), 8 * MiB, owner)
    return body


def pvc(owner: str = "alice", volume: str = PV, mode: str = "Block") -> dict:
    body = rvc.pvc_body(NS, CLAIM, volume, 8 * MiB, owner)
    body["spec"]["volumeMode"] = mode
    return body


def image(owner: str | None = "alice") -> dict:
    return {"size": 8 * MiB, "meta": {META_OWNER: owner} if owner else {}}


def test_derived_name_is_namespace_dot_claim_and_fits_128() -> None:
    assert rvc.derived_name("alice", "web-root") == "alice.web-root"
    long = rvc.derived_name("a" * 63, "b" * 63 + "-root")
    assert len(long) == 128 and long.startswith("a" * 63 + ".")
    # a namespace has no '.', so two claims never share a name: a-b/c vs a/b-c
    assert rvc.derived_name("a-b", "c") != rvc.derived_name("a", "b-c")


def test_nothing_exists_plans_template_clone_mark_pv_and_claim() -> None:
    obs = rvc.Observed(None, template_size=8 * MiB, image_set=IMAGE_SET)
    assert rvc.plan(params(size_mib=16), obs) == [
        "clone rbd/tmpl-debian-bookworm-1@base rbd/alice.web-root", f"set image-meta {META_OWNER} alice",
        "resize rbd/alice.web-root 16", "create PersistentVolume alice.web-root",
        "create PersistentVolumeClaim alice/web-root"]


def test_everything_ours_plans_nothing() -> None:
    assert rvc.plan(params(), rvc.Observed(image(), pv=pv(), pvc=pvc())) == []


def test_a_missing_claim_of_an_existing_ours_pv_is_created() -> None:
    assert rvc.plan(params(), rvc.Observed(image(), pv=pv())) == ["create PersistentVolumeClaim alice/web-root"]


@pytest.mark.parametrize(("obs", "want"), [
    (rvc.Observed(image("bob")), f"RBD image rbd/{PV}: image-meta {META_OWNER} is bob, not alice"),
    (rvc.Observed(image(None)), f"RBD image rbd/{PV}: image-meta {META_OWNER} is (none), not alice"),
    (rvc.Observed(image(), pv=pv(owner="bob")),
     f"PersistentVolume {PV}: metadata.labels[cloud.zjusct.io/owner] is bob, not alice"),
    (rvc.Observed(image(), pv=pv(claim=("bob", "x"))),
     f"PersistentVolume {PV}: spec.claimRef is bob/x, not alice/web-root"),
    (rvc.Observed(image(), pv=pv(image="other")), f"PersistentVolume {PV}: spec.csi names rbd.csi.ceph.com rbd/other"),
    (rvc.Observed(None, pv=pv(), image_set=IMAGE_SET), f"PersistentVolume {PV}: spec.csi names RBD image rbd/{PV}, "
                                                       "which does not exist"),
    (rvc.Observed(image(), pvc=pvc(owner="bob")),
     "PersistentVolumeClaim alice/web-root: metadata.labels[cloud.zjusct.io/owner] is bob, not alice"),
    (rvc.Observed(image(), pvc=pvc(volume="x")), "PersistentVolumeClaim alice/web-root: spec.volumeName is x, not"),
    (rvc.Observed(image(), pvc=pvc(mode="Filesystem")),
     "spec.volumeMode is Filesystem, an RBD root volume needs Block"),
    (rvc.Observed(None), "image: required to create the RBD image rbd/alice.web-root"),
    (rvc.Observed(None, pool_exists=False, image_set=IMAGE_SET), "pool: 'rbd' does not exist"),
])
def test_refusals_name_the_object_and_the_field(obs: rvc.Observed, want: str) -> None:
    with pytest.raises(rvc.ClaimRefused) as err:
        rvc.plan(params(), obs)
    assert want in str(err.value)


def test_all_conflicts_are_named_in_one_message() -> None:
    with pytest.raises(rvc.ClaimRefused) as err:
        rvc.plan(params(), rvc.Observed(image("bob"), pv=pv(owner="bob"), pvc=pvc(owner="bob")))
    assert str(err.value).count(" is bob, not alice") == 3


def test_size_below_the_image_is_refused() -> None:
    with pytest.raises(rvc.ClaimRefused, match="size_mib: 4 is below the image's size 8"):
        rvc.plan(params(size_mib=4), rvc.Observed(None, template_size=8 * MiB, image_set=IMAGE_SET))


@pytest.mark.parametrize(("key", "value", "want"), [
    ("owner", "Alice", f"owner: 'Alice' is not a DNS label ({DNS_LABEL_RULE})"),
    ("namespace", "a.b", f"namespace: 'a.b' is not a DNS label ({DNS_LABEL_RULE})"),
    ("name", "Web", "name: 'Web' is not a DNS subdomain"),
    ("rbd_image", "x" * 129, "rbd_image: "),
    ("volume_name", "UP", "volume_name: 'UP' is not 1-128"),
    ("size_mib", 0, "size_mib: 0 is not in 1 to 67108864"),
])
def test_validate_names_the_option_and_the_value(key: str, value: object, want: str) -> None:
    with pytest.raises(rvc.ClaimRefused) as err:
        rvc.validate(params(**{key: value}))
    assert want in str(err.value)


def test_bodies_are_what_the_controller_reads() -> None:
    body = rvc.pv_body(PV, NS, CLAIM, ImageRef("rbd", PV), 2048 * MiB, "alice")
    assert body["spec"]["csi"] == {"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/alice.web-root",
                                   "volumeAttributes": {"pool": "rbd", "imageName": PV}}
    assert (body["spec"]["claimRef"]["namespace"], body["spec"]["claimRef"]["name"]) == (NS, CLAIM)
    assert body["spec"]["capacity"] == {"storage": "2048Mi"} and body["spec"]["volumeMode"] == "Block"
    claim = rvc.pvc_body(NS, CLAIM, PV, 2048 * MiB, "alice")
    assert claim["spec"]["volumeName"] == PV and claim["metadata"]["labels"] == {"cloud.zjusct.io/owner": "alice"}



def test_the_claim_mark_of_a_deleted_cloudvm_is_released_and_a_live_ones_kept() -> None:
    marked = pvc()
    marked["metadata"]["annotations"] = {CLAIMED_BY_MARK: "uid-1"}
    assert rvc.plan(params(), rvc.Observed(image(), pv=pv(), pvc=marked)) == [
        "release the claim mark of deleted CloudVM uid uid-1 on PersistentVolumeClaim alice/web-root"]
    assert rvc.plan(params(), rvc.Observed(image(), pv=pv(), pvc=marked, claim_holder="alice/web")) == []
