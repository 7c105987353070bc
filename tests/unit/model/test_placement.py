"""Four-dimension overcommit (plugins/module_utils/model/placement.py)."""

from __future__ import annotations

from ansible_collections.zjusct.cloud.plugins.module_utils.model.placement import Node, check, used
from hypothesis import given
from hypothesis import strategies as st

NODE = Node("h1", {"cpu": 2, "memory": 4096, "disk": 10240, "bandwidth": 1000})


def test_request_over_a_dimension_is_refused_naming_it():
    verdict = check(NODE, {"cpu": 7}, {"cpu": 2, "memory": 512})
    assert not verdict.fits and verdict.dimension == "cpu"
    assert verdict.message.startswith("cpu: requested 2 vCPUs but only 1 of 8 vCPUs")


def test_memory_ratio_applies():
    assert check(NODE, {}, {"memory": 6144}).fits
    verdict = check(NODE, {}, {"memory": 6145})
    assert verdict.dimension == "memory"


def test_water_level_alert_at_90_percent():
    verdict = check(NODE, {"cpu": 7}, {"cpu": 0.2})
    assert verdict.fits and verdict.alerts == ("cpu",)


def test_used_sums_one_node():
    rows = [{"node": "h1", "vcpus": 1, "memory_mib": 512, "disk_mib": 100, "bandwidth_mbps": 10},
            {"node": "h2", "vcpus": 3, "memory_mib": 512, "disk_mib": 100, "bandwidth_mbps": 10}]
    assert used(rows, "h1") == {"cpu": 1, "memory": 512, "disk": 100, "bandwidth": 10}


@given(st.lists(st.integers(min_value=1, max_value=4), max_size=60))
def test_admitted_requests_never_exceed_capacity(requests):
    allocated = {"cpu": 0.0}
    for r in requests:
        if check(NODE, allocated, {"cpu": r}).fits:
            allocated["cpu"] += r
    assert allocated["cpu"] <= NODE.capacity("cpu")
