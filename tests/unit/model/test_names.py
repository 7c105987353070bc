"""The naming rule for derived, length-limited names (plugins/module_utils/model/names.py, zjusct_launcher/names.py)."""

from __future__ import annotations

import re

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import bandwidth as _bandwidth
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as _hostnet
from hypothesis import given
from hypothesis import strategies as st
from zjusct_launcher import names as launcher_names

# interface-name characters (dev_valid_name refuses '/', ':' and whitespace)
IFCHARS = st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="/:")
DEVICE = st.text(IFCHARS, min_size=1, max_size=15)
LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SUBDOMAIN = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


def test_issue_input_gives_two_distinct_ifbs_within_ifnamsiz():
    a, b = _names.ifb_name("vmtap-alice-01"), _names.ifb_name("vmtap-alice-02")
    assert a != b and len(a) == len(b) == 15
    assert a.startswith("zqivmta") and b.startswith("zqivmta")
    assert _names.ifb_name("tap0") == "zqitap0"  # short names stay readable, unhashed


def test_tc_qos_and_the_host_backend_use_one_rule():
    for dev in ("tap0", "vmtap-alice-01", _hostnet.tap_name("uid-1")):
        assert _bandwidth.ifb_name(dev) == _names.ifb_name(dev)
    assert _hostnet.tap_name("uid-1") == _names.tap_name("uid-1") == "zjt" + _names.digest("uid-1", 10)


@given(st.text(min_size=0, max_size=300), st.integers(min_value=9, max_value=260))
def test_fit_is_bounded_stable_and_verbatim_only_below_the_limit(full, limit):
    name = _names.fit(full, limit)
    assert len(name) <= limit and name == _names.fit(full, limit)
    if len(full) < limit:
        assert name == full
    else:
        assert len(name) == limit and name.startswith(full[:limit - 8]) and name[-8:] == _names.digest(full)


@given(DEVICE, DEVICE)
def test_ifb_names_of_distinct_devices_differ(a, b):
    if a != b:
        assert _names.ifb_name(a) != _names.ifb_name(b)
    assert len(_names.ifb_name(a)) <= 15


@given(st.text(IFCHARS, min_size=1, max_size=3), st.text(IFCHARS, min_size=0, max_size=12),
       st.text(IFCHARS, min_size=0, max_size=12))
def test_names_sharing_the_cut_prefix_do_not_collide(prefix, x, y):
    full_x, full_y = "vmtap-alice-" + prefix + x, "vmtap-alice-" + prefix + y
    if full_x != full_y:
        assert _names.ifname("zqi", full_x) != _names.ifname("zqi", full_y)


def test_a_limit_without_room_for_the_hash_is_refused():
    with pytest.raises(ValueError, match="limit: 8 leaves no room"):
        _names.fit("x" * 20, 8)


@given(st.text(max_size=300), st.integers(min_value=9, max_value=260))
def test_the_launcher_applies_the_same_rule(full, limit):
    assert launcher_names.fit(full, limit) == _names.fit(full, limit)
    assert launcher_names.digest(full) == _names.digest(full)


@given(SUBDOMAIN)
def test_host_name_from_a_vm_name_is_a_label(name):
    label = launcher_names.dns_label(name)
    assert LABEL_RE.match(label), label
    assert label == launcher_names.dns_label(name)
    if len(name) < 63 and LABEL_RE.match(name):
        assert label == name


@given(SUBDOMAIN, SUBDOMAIN)
def test_host_names_of_distinct_vm_names_differ(a, b):
    if a != b:
        assert launcher_names.dns_label(a) != launcher_names.dns_label(b)


def test_long_vm_names_sharing_63_characters_get_distinct_host_names():
    a, b = "a" * 70 + "-one", "a" * 70 + "-two"
    ha, hb = launcher_names.dns_label(a), launcher_names.dns_label(b)
    assert ha != hb and len(ha) <= 63 and ha.startswith("a" * 54 + "-")
    assert launcher_names.dns_label("web.alice") == "web-alice-" + _names.digest("web.alice")


@given(st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z"), SUBDOMAIN)
def test_firecracker_id_is_valid_and_keeps_names_apart(ns, name):
    got = launcher_names.firecracker_id(f"{ns}-{name}")
    assert re.fullmatch(r"[A-Za-z0-9-]{1,64}", got), got
    assert launcher_names.firecracker_id(f"{ns}-{name}x") != got


@given(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=250))
def test_a_name_with_a_fixed_suffix_stays_within_the_limit_and_keeps_the_suffix(image):
    suffix = ".importing-0123abcd"
    name = _names.with_suffix(image, suffix, _names.RBD_NAME_MAX)
    assert len(name) <= 250 and name.endswith(suffix)
    assert name == image + suffix if len(image) < 250 - len(suffix) else name.startswith(image[:223])


def test_backup_snapshot_names_keep_their_prefix_and_are_not_cut():
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import SNAP_PREFIX, snapshot_name

    assert snapshot_name("20261130T171200Z-0a1b2c") == SNAP_PREFIX + "20261130T171200Z-0a1b2c"
    assert len(snapshot_name("x" * 300)) == 250 and snapshot_name("x" * 300).startswith(SNAP_PREFIX)


@pytest.mark.parametrize("vm_name", ["web.alice", "a" * 70 + "-one", "a" * 70 + "-two"])
def test_the_launcher_accepts_a_vm_name_that_is_no_label_and_derives_its_host_name(vm_name):
    import json
    from pathlib import Path

    from zjusct_launcher import config

    doc = json.loads((Path(config.__file__).parents[1] / "examples" / "config-qemu-tap.json").read_text())
    doc.pop("identity")
    doc["vm"]["name"] = vm_name  # a DNS-1123 subdomain; the old default vm.name[:63] was refused or collided
    cfg = config.parse(doc)
    assert cfg.identity.hostname == launcher_names.dns_label(vm_name)
    assert LABEL_RE.match(cfg.identity.hostname)
