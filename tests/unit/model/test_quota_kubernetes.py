"""The Kubernetes side of the per-owner quota (model.quota): what a CloudVM object counts once the controller
admitted its boot, a boot's check against the owner's CloudQuota, and the refusal's message read back by the
cloudvm module. The real controller and API server: tests/integration/cloudvm_k8s/test_controller_quota.py."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota


def spec(power: str = "Running", boot: int = 1, vcpus: int = 1, memory: int = 512, guaranteed: int = 0) -> dict:
    out: dict[str, Any] = {"owner": "alice", "powerState": power, "bootID": boot, "vcpus": vcpus,
                           "memoryMiB": memory, "rootVolumeClaim": "web-root"}
    if guaranteed:
        out["network"] = {"bandwidth": {"guaranteedMbps": guaranteed, "ceilMbps": 10 * guaranteed}}
    return out


def item(admitted: int | None, claim: str = "web-root", disk: int = 2048, **kw: Any) -> quota.Counted:
    return quota.Counted(spec(**kw), admitted, ("team-a", claim), disk)


@pytest.mark.parametrize("text, mib", [("2Gi", 2048), ("2048Mi", 2048), ("1073741824", 1024), ("1.5Gi", 1536),
                                       ("1G", 954), ("1e9", 954), ("0", 0), ("1Ki", 1), ("3Ti", 3 * 2**20)])
def test_quantities_of_bytes_are_mib_rounded_up(text: str, mib: int) -> None:
    assert quota.quantity_mib(text) == mib


@pytest.mark.parametrize("text", ["", "-1Gi", "2GB", "Gi", "1.2.3"])
def test_a_quantity_that_is_not_one_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        quota.quantity_mib(text)


def test_a_claim_counts_its_bound_capacity_else_its_request() -> None:
    claim = {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    assert quota.claim_mib(claim) == 1024
    assert quota.claim_mib({**claim, "status": {"capacity": {"storage": "2Gi"}}}) == 2048
    assert quota.claim_mib(None) == quota.claim_mib({}) == 0


def test_a_root_volume_grown_by_its_spec_counts_the_larger_size() -> None:
    """spec.rootVolumeSizeMiB grows the RBD image at the next boot while the claim keeps its capacity: the quota counts
    the larger of the two, so a tenant cannot grow past diskMiB by editing the spec."""
    claim = {"status": {"capacity": {"storage": "2Gi"}}}
    assert quota.root_volume_mib(claim, {}) == 2048
    assert quota.root_volume_mib(claim, {"rootVolumeSizeMiB": 16777216}) == 16777216
    assert quota.root_volume_mib(claim, {"rootVolumeSizeMiB": 1024}) == 2048  # a disk never shrinks
    assert quota.root_volume_mib(None, {"rootVolumeSizeMiB": 4096}) == 4096
    limits = quota.limits_from_spec({"diskMiB": 4096})
    spec = {"owner": "alice", "powerState": "Running", "bootID": 2, "rootVolumeSizeMiB": 8192}
    grown = quota.Counted(spec, 1, ("team-a", "web-root"), quota.root_volume_mib(claim, spec),
                          held_disk_mib=quota.claim_mib(claim))
    refusal = quota.check_boot("alice", limits, [], grown, "team-a", "web")
    assert refusal is not None and refusal.details() == {
        "reason": "QuotaExceeded", "quota": "disk_mib", "owner": "alice", "limit": 4096, "in_use": 2048,
        "requested": 6144}, refusal  # the boot asks the growth beyond the claim
    within = quota.Counted({**spec, "rootVolumeSizeMiB": 3072}, 1, ("team-a", "web-root"), 3072, held_disk_mib=2048)
    assert quota.check_boot("alice", limits, [], within, "team-a", "web") is None
    # without held_disk_mib the growth would be taken as already held (the hole this closes)
    assert quota.check_boot("alice", limits, [], quota.Counted(spec, 1, ("team-a", "web-root"), 8192), "team-a",
                            "web") is None


def test_the_admitted_boot_is_the_status_field_or_an_older_status_naming_its_pod() -> None:
    assert quota.admitted_boot({"admittedBootID": 3, "bootID": 4}) == 3
    assert quota.admitted_boot({"bootID": 2, "pod": "web-boot-2"}) == 2  # written before admittedBootID existed
    assert quota.admitted_boot({"bootID": 2, "phase": "Blocked"}) is None
    assert quota.admitted_boot(None) is None


def test_a_vm_counts_nothing_before_its_first_admitted_boot_and_its_vm_and_disk_after() -> None:
    assert quota.counted_footprint(item(None)) == quota.zero()  # the host's refused create
    assert quota.counted_footprint(item(1, boot=2)) == dict(quota.zero(), vms=1, disk_mib=2048)  # next boot not yet
    assert quota.counted_footprint(item(1, power="Stopped")) == dict(quota.zero(), vms=1, disk_mib=2048)
    assert quota.counted_footprint(item(1, vcpus=2, memory=1024, guaranteed=50)) == {
        "vms": 1, "vcpus": 2, "memory_mib": 1024, "disk_mib": 2048, "bandwidth_mbps": 50}


def test_usage_counts_each_claim_once() -> None:
    got = quota.counted_usage([item(1), item(1, claim="web-root"), item(1, claim="db-root", disk=1024), item(None)])
    assert got == {"vms": 3, "vcpus": 3, "memory_mib": 1536, "disk_mib": 3072, "bandwidth_mbps": 0}


def test_a_boot_over_vcpus_is_refused_in_the_hosts_message_shape_naming_option_and_field() -> None:
    limits = quota.limits_from_spec({"vcpus": 2})
    others = [item(1, vcpus=2)]
    refusal = quota.check_boot("alice", limits, others, item(None, claim="b-root"), "team-b", "web")
    assert refusal is not None
    assert refusal.message == (
        "vcpus: owner 'alice' would use 3 of quota 2 vCPUs (in use 2, this request 1, asked by vcpus, spec.vcpus of"
        " CloudVM team-b/web); stop another VM of 'alice', or ask the operator to raise owner_quota vcpus")
    assert refusal.details() == {"reason": "QuotaExceeded", "quota": "vcpus", "owner": "alice", "limit": 2,
                                 "in_use": 2, "requested": 1}
    assert quota.check_boot("alice", limits, [item(1, vcpus=2, power="Stopped")], item(None, claim="b-root"),
                            "team-b", "web") is None  # stopping the other VM frees its vCPUs
    assert quota.check_boot("alice", None, others, item(None), "team-b", "web") is None  # no CloudQuota


def test_vms_and_disk_are_asked_only_by_a_first_boot() -> None:
    limits = quota.limits_from_spec({"vms": 1, "diskMiB": 2048})
    first = quota.check_boot("alice", limits, [item(1, power="Stopped")], item(None, claim="b-root"), "ns", "b")
    assert first is not None and first.dimension == "vms"
    assert "asked by name, metadata.name of CloudVM ns/b" in first.message
    # the VM admitted before boots again (a restart, bootID 2): it holds its VM and its disk already
    assert quota.check_boot("alice", limits, [], item(1, boot=2), "ns", "web") is None
    disk = quota.check_boot("alice", quota.limits_from_spec({"diskMiB": 3000}), [item(1, power="Stopped")],
                            item(None, claim="b-root", disk=1024), "ns", "b")
    assert disk is not None and disk.dimension == "disk_mib"
    assert "asked by volume_size_mib, spec.rootVolumeClaim b-root of CloudVM ns/b" in disk.message


def test_a_quota_lowered_below_the_usage_refuses_only_growth() -> None:
    limits = quota.limits_from_spec({"vcpus": 1})
    running = [item(1, vcpus=4)]
    assert quota.check_boot("alice", limits, running, item(1, power="Stopped", claim="b"), "ns", "b") is None
    refusal = quota.check_boot("alice", limits, running, item(None, claim="b"), "ns", "b")
    assert refusal is not None and (refusal.in_use, refusal.requested) == (4, 1)


@pytest.mark.parametrize("dim", quota.LIMITS)
def test_every_refusal_message_reads_back_into_the_hosts_failure_fields(dim: str) -> None:
    refusal = quota.Refusal("bob-2", dim, 7, 6, 3, asked_by=quota.asked_by(dim, "ns", "vm", "vm-root"))
    assert quota.parse_message(refusal.message) == refusal.details()


def test_other_messages_are_no_refusal() -> None:
    assert quota.parse_message("the API server refused the launcher Pod ns/web-boot-1 (HTTP 403): exceeded quota")\
        is None
    assert quota.parse_message(None) is None


def test_cloudquota_spec_and_limits_are_one_another() -> None:
    limits = {"vms": 2, "vcpus": None, "memory_mib": 4096, "disk_mib": 0, "bandwidth_mbps": None}
    assert quota.spec_from_limits(limits) == {"vms": 2, "memoryMiB": 4096, "diskMiB": 0}
    assert quota.limits_from_spec(quota.spec_from_limits(limits)) == limits
    assert quota.limits_from_spec(None) == dict.fromkeys(quota.LIMITS)
