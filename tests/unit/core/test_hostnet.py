"""Pure network decisions (plugins/module_utils/_hostnet.py)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils._hostnet import (
    NetworkError,
    allocate_ipv4,
    isolation_ruleset,
    mac_address,
    tap_name,
)


def test_tap_and_mac_are_stable_and_distinct():
    assert tap_name("u1") == tap_name("u1") and len(tap_name("u1")) <= 15
    assert tap_name("u1") != tap_name("u2")
    mac = mac_address("u1")
    assert mac == mac_address("u1") and mac.startswith("02:") and len(mac.split(":")) == 6


def test_addresses_skip_gateway_and_used_and_run_out():
    assert allocate_ipv4("10.200.0.0/29", []) == "10.200.0.2"
    assert allocate_ipv4("10.200.0.0/29", ["10.200.0.2", "10.200.0.3"]) == "10.200.0.4"
    with pytest.raises(NetworkError, match="no free address"):
        allocate_ipv4("10.200.0.0/30", ["10.200.0.2"])


def test_isolation_drops_only_between_owners():
    rules = isolation_ruleset({"alice": ["zjta1", "zjta2"], "bob": ["zjtb1"]})
    assert 'iifname "zjta1" oifname { zjtb1 } drop' in rules
    assert 'iifname "zjtb1" oifname { zjta1, zjta2 } drop' in rules
    assert "zjta2 } drop" not in rules.split('iifname "zjta1"')[1].split("\n")[0]
