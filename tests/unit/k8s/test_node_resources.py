"""The pure parts of ``zjusct.cloud.k8s_node_resources`` (plugins/module_utils/k8s/k8s_node_resources_module.py):
the extended resource name rule, quantities, and the JSON Patch of ``nodes/<name>/status``. The API server's side is
tests/integration/cloudvm_k8s/test_cluster_node_bandwidth.py.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.k8s_node_resources_module import (
    NodeResourcesError,
    check_resources,
    plan,
    quantity,
)

BW = "cloud.zjusct.io/bandwidth-mbps"


def test_integers_and_digit_strings_are_accepted() -> None:
    assert check_resources({BW: 100, "example.com/dongle": "4"}, "present") == {BW: 100, "example.com/dongle": 4}
    assert check_resources({BW: 0}, "present") == {BW: 0}


@pytest.mark.parametrize("value", [-1, "10G", "1.5", 1.5, True, None, "", [100]])
def test_a_value_that_is_not_a_whole_number_fails_naming_the_resource_and_the_value(value: object) -> None:
    with pytest.raises(NodeResourcesError, match=rf"resources\.{BW}: .* is not an integer >= 0"):
        check_resources({BW: value}, "present")


@pytest.mark.parametrize("name", ["bandwidth", "kubernetes.io/bandwidth", "foo.kubernetes.io/x", "cpu",
                                  "Cloud.zjusct.io/x", "cloud.zjusct.io/", "cloud.zjusct.io/-x",
                                  "cloud.zjusct.io/requests.x", "a/b/c"])
def test_a_name_outside_the_extended_resource_rule_is_refused(name: str) -> None:
    with pytest.raises(NodeResourcesError, match="is not an extended resource name"):
        check_resources({name: 1}, "present")


def test_nothing_to_set_is_refused() -> None:
    with pytest.raises(NodeResourcesError, match="resources: empty"):
        check_resources({}, "present")


@pytest.mark.parametrize(("text", "value"), [("100", 100), ("1k", 1000), ("2Gi", 2 * 2**30), ("500m", "0.5"),
                                             ("1e3", 1000), ("0", 0)])
def test_quantities_are_compared_by_value(text: str, value: object) -> None:
    assert quantity(text) == Decimal(str(value))


def test_quantity_of_nothing_or_garbage_is_none() -> None:
    assert quantity(None) is None and quantity("ten") is None


def test_plan_adds_to_capacity_and_allocatable_with_the_slash_escaped() -> None:
    status = {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}
    ops, before, after = plan(status, {BW: 100}, "present")
    assert ops == [{"op": "add", "path": "/status/capacity/cloud.zjusct.io~1bandwidth-mbps", "value": "100"},
                   {"op": "add", "path": "/status/allocatable/cloud.zjusct.io~1bandwidth-mbps", "value": "100"}]
    assert (before, after) == ({BW: None}, {BW: "100"})


def test_plan_is_empty_when_the_value_is_there_in_any_notation() -> None:
    status = {"capacity": {BW: "1k"}, "allocatable": {BW: "1000"}}
    assert plan(status, {BW: 1000}, "present")[0] == []


def test_plan_fixes_only_the_field_that_differs() -> None:
    # a kubelet that has not yet copied a new capacity into allocatable
    ops, _, _ = plan({"capacity": {BW: "100"}, "allocatable": {BW: "60"}}, {BW: 100}, "present")
    assert ops == [{"op": "add", "path": "/status/allocatable/cloud.zjusct.io~1bandwidth-mbps", "value": "100"}]


def test_plan_adds_a_missing_map_whole() -> None:
    ops, _, _ = plan({}, {BW: 5}, "present")
    assert ops == [{"op": "add", "path": "/status/capacity", "value": {BW: "5"}},
                   {"op": "add", "path": "/status/allocatable", "value": {BW: "5"}}]


def test_absent_removes_what_is_there_and_nothing_else() -> None:
    ops, before, after = plan({"capacity": {BW: "100"}, "allocatable": {}}, {BW: 0}, "absent")
    assert ops == [{"op": "remove", "path": "/status/capacity/cloud.zjusct.io~1bandwidth-mbps"}]
    assert (before, after) == ({BW: "100"}, {BW: None})
    assert plan({"capacity": {}, "allocatable": {}}, {BW: 0}, "absent")[0] == []
