"""Pure network decisions (plugins/module_utils/network/hostnet.py)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.network.hostnet import (
    NetworkError,
    allocate_ipv4,
    guard_ruleset,
    isolation_elements,
    isolation_skeleton,
    mac_address,
    tap_name,
    uplink_outer_ruleset,
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


def test_isolation_elements_pair_only_taps_of_one_owner():
    groups = {"alice": [{"tap": "zjta1", "mac": "02:00:00:00:00:A1", "ipv4": "10.200.0.2"},
                        {"tap": "zjta2", "mac": "02:00:00:00:00:a2", "ipv4": "10.200.0.3/24"}],
              "bob": [{"tap": "zjtb1", "mac": "02:00:00:00:00:b1", "ipv4": "10.200.0.4"}]}
    el = isolation_elements(groups)
    assert el["same_owner"] == {("zjta1", "zjta2"), ("zjta2", "zjta1")}  # bob's single TAP pairs with nobody
    assert el["guest_mac"] == {("zjta1", "02:00:00:00:00:a1"), ("zjta2", "02:00:00:00:00:a2"),
                               ("zjtb1", "02:00:00:00:00:b1")}
    assert ("zjta2", "10.200.0.3") in el["guest_ipv4"] and el["guest_addrs"] == {"10.200.0.2", "10.200.0.3",
                                                                                 "10.200.0.4"}
    assert isolation_elements({}) == {"guest_mac": set(), "guest_ipv4": set(), "guest_addrs": set(),
                                      "same_owner": set()}


@pytest.mark.parametrize("guest, field", [({"tap": 'zjt"; flush ruleset', "mac": "02:00:00:00:00:01",
                                            "ipv4": "10.0.0.2"}, "tap:"),
                                          ({"tap": "zjt1", "mac": "02:00", "ipv4": "10.0.0.2"}, "mac:"),
                                          ({"tap": "zjt1", "mac": "02:00:00:00:00:01", "ipv4": "10.0.0.300"},
                                           "ipv4:")])
def test_isolation_elements_refuse_malformed_leases(guest, field):
    with pytest.raises(NetworkError, match=field):
        isolation_elements({"alice": [guest]})


def test_rules_default_deny_for_guests():
    skeleton = "\n".join(isolation_skeleton())
    assert "iifname . ether saddr != @guest_mac drop" in skeleton
    assert "ether type arp iifname . arp saddr ip != @guest_ipv4 drop" in skeleton
    from_guest = skeleton.split("chain from_guest {")[1].split("}")[0].strip().splitlines()
    assert from_guest[-1].strip() == "drop"  # anything else a guest sends (IPv6, VLAN tags, ...) is dropped
    guard = guard_ruleset("zjbr0", "zjup1")
    assert '  iifname "zjbr0" drop' in guard and '  iifname "zjbr0" oifname "zjup1" accept' in guard
    assert not any("forward" in line for line in guard_ruleset("zjbr0", "zjup1", forward=False))
    outer = uplink_outer_ruleset("10.200.0.0/24", "100.64.255.0/30")
    assert '  iifname "zjup0" ip saddr 10.200.0.0/24 drop' in outer  # guests, not the cloud's namespace itself
    assert '  ip saddr { 10.200.0.0/24, 100.64.255.0/30 } oifname != "zjup0" masquerade' in outer
