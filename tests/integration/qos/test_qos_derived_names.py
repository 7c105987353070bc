"""Derived IFB names in a scratch netns with real TAPs and real tc: collision-free and ownership-checked.

Issue input: TAPs ``vmtap-alice-01`` and ``vmtap-alice-02`` (same first 12 characters); tc_qos ingress on 01
(10 Mbit/s), then on 02 (20 Mbit/s). Before the fix both were redirected into one IFB ``zqivmtap-alice-``,
01's class was replaced by 02's and the task failed after changing the kernel.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import bandwidth as bw
from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import QoSStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.tc_qos_module import ARGUMENT_SPEC, run
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc
from qos_netlab import make_lab, sh

pytestmark = pytest.mark.netns

TAP1, TAP2 = "vmtap-alice-01", "vmtap-alice-02"
MAC1, MAC2 = "02:7a:00:00:01:01", "02:7a:00:00:01:02"


@pytest.fixture
def ns():
    lab = make_lab(0)
    for tap in (TAP1, TAP2):
        sh("ip", "-n", lab.host, "tuntap", "add", "dev", tap, "mode", "tap")
        sh("ip", "-n", lab.host, "link", "set", tap, "master", "br0", "up")
    yield lab.host
    lab.close()


def params(**kw):
    p = {k: v.get("default") for k, v in ARGUMENT_SPEC.items()}
    p.update(kw)
    return p


def ingress(ns: str, device: str, mac: str, rate: int, **kw) -> dict:
    return run(params(device=device, netns=ns, direction="ingress", root_rate_mbps=1000,
                      classes=[{"name": device, "rate_mbps": rate, "match": {"mac": mac}}], **kw), False)


def ifbs(ns: str) -> dict[str, str]:
    """IFB name -> its ifalias, as ``ip -d link`` reports them."""
    links = json.loads(sh("ip", "-n", ns, "-j", "-d", "link", "show", "type", "ifb").stdout or "[]")
    return {link["ifname"]: link.get("ifalias", "") for link in links}


def class_rates(ns: str, dev: str) -> list[str]:
    """``<classid> rate <rate>`` of the VM classes (7a:10..7a:fff) on ``dev`` as ``tc class show`` prints them."""
    out = []
    for line in sh("tc", "-n", ns, "class", "show", "dev", dev).stdout.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"] and words[2] not in ("7a:1", "7a:ffff"):
            out.append(f"{words[2]} rate {words[words.index('rate') + 1]}")
    return out


def redirect_target(ns: str, dev: str) -> str:
    """The device named by the mirred redirect on ``dev``'s ingress ('' when there is none)."""
    text = sh("tc", "-n", ns, "filter", "show", "dev", dev, "ingress").stdout
    for word in text.replace("(", " ").replace(")", " ").split():
        if word in ifbs(ns):
            return word
    return ""


def test_issue_input_two_taps_sharing_a_prefix_get_two_ifbs_and_absent_on_02_leaves_01(ns):
    one = ingress(ns, TAP1, MAC1, 10)
    assert one["changed"]
    two = ingress(ns, TAP2, MAC2, 20)  # raised "kernel state differs after apply" before the fix
    assert two["changed"]
    ifb1, ifb2 = _names.ifb_name(TAP1), _names.ifb_name(TAP2)
    assert ifb1 != ifb2 and max(len(ifb1), len(ifb2)) <= 15
    assert ifbs(ns) == {ifb1: _tc.IFB_ALIAS_PREFIX + TAP1, ifb2: _tc.IFB_ALIAS_PREFIX + TAP2}
    assert redirect_target(ns, TAP1) == ifb1 and redirect_target(ns, TAP2) == ifb2
    assert class_rates(ns, ifb1) == ["7a:10 rate 10Mbit"]
    assert class_rates(ns, ifb2) == ["7a:10 rate 20Mbit"]
    assert not ingress(ns, TAP1, MAC1, 10)["changed"] and not ingress(ns, TAP2, MAC2, 20)["changed"]

    gone = run(params(device=TAP2, netns=ns, direction="ingress", state="absent"), False)
    assert gone["changed"]
    assert ifbs(ns) == {ifb1: _tc.IFB_ALIAS_PREFIX + TAP1}
    assert "ingress" not in sh("tc", "-n", ns, "qdisc", "show", "dev", TAP2).stdout
    assert redirect_target(ns, TAP1) == ifb1
    assert class_rates(ns, ifb1) == ["7a:10 rate 10Mbit"]
    assert not ingress(ns, TAP1, MAC1, 10)["changed"]


def test_naming_another_devices_ifb_is_refused_before_any_change(ns):
    ingress(ns, TAP1, MAC1, 10)
    ifb1 = _names.ifb_name(TAP1)
    before = (ifbs(ns), class_rates(ns, ifb1), redirect_target(ns, TAP1))
    for check_mode in (True, False):
        with pytest.raises(_tc.TcError, match=f"ifb: '{ifb1}' in netns {ns} is the IFB of device '{TAP1}'"):
            run(params(device=TAP2, netns=ns, direction="ingress", ifb=ifb1, root_rate_mbps=1000,
                       classes=[{"name": "b", "rate_mbps": 20, "match": {"mac": MAC2}}]), check_mode)
    with pytest.raises(_tc.TcError, match="is the IFB of device"):
        run(params(device=TAP2, netns=ns, direction="ingress", ifb=ifb1, state="absent"), False)
    assert (ifbs(ns), class_rates(ns, ifb1), redirect_target(ns, TAP1)) == before
    assert "ingress" not in sh("tc", "-n", ns, "qdisc", "show", "dev", TAP2).stdout


def test_an_ifb_not_created_by_us_is_not_taken_over(ns):
    sh("ip", "-n", ns, "link", "add", "usersifb", "type", "ifb")
    with pytest.raises(_tc.TcError, match=r"ifb: 'usersifb' .* was not created by zjusct\.cloud"):
        ingress(ns, TAP1, MAC1, 10, ifb="usersifb")
    assert ifbs(ns) == {"usersifb": ""}
    assert "ingress" not in sh("tc", "-n", ns, "qdisc", "show", "dev", TAP1).stdout


def test_an_ifb_name_longer_than_ifnamsiz_is_refused_naming_the_option(ns):
    with pytest.raises(_tc.TcError, match=r"ifb: 'zqi-much-too-long-name' has 22 characters; .* 1-15"):
        ingress(ns, TAP1, MAC1, 10, ifb="zqi-much-too-long-name")
    assert ifbs(ns) == {}


def test_an_ifb_left_by_the_earlier_cut_name_rule_is_removed_once_the_new_one_redirects(ns):
    legacy = ("zqi" + TAP1)[:15]  # the name tc_qos derived before the naming rule (shared by 01 and 02)
    sh("ip", "-n", ns, "link", "add", legacy, "type", "ifb")
    sh("ip", "-n", ns, "link", "set", legacy, "alias", _tc.IFB_ALIAS_PREFIX + TAP1)
    res = ingress(ns, TAP1, MAC1, 10)
    assert f"remove stale ifb {legacy} (an earlier ifb of {TAP1})" in res["ops"]
    assert ifbs(ns) == {_names.ifb_name(TAP1): _tc.IFB_ALIAS_PREFIX + TAP1}
    assert not ingress(ns, TAP1, MAC1, 10)["changed"]


def test_host_backend_uses_the_same_rule_and_keeps_the_taps_apart(ns, tmp_path):
    host = HostStore(str(tmp_path / "host.db"))
    try:
        qs = QoSStore(host.conn)
        bw.configure(qs, 1000, 1.0, {"p": 1000})
        for vm, tap, mac, rate in (("vm1", TAP1, MAC1, 10), ("vm2", TAP2, MAC2, 20)):
            d = bw.apply_vm_bandwidth(qs, netns=ns, device=tap, vm_id=vm, mac=mac, guaranteed_mbps=rate,
                                      ceil_mbps=rate, pool="p")
            assert d.admitted, d
        ifb1, ifb2 = bw.ifb_name(TAP1), bw.ifb_name(TAP2)
        assert (ifb1, ifb2) == (_names.ifb_name(TAP1), _names.ifb_name(TAP2)) and ifb1 != ifb2
        assert set(ifbs(ns)) == {ifb1, ifb2}
        assert redirect_target(ns, TAP1) == ifb1 and redirect_target(ns, TAP2) == ifb2
        assert [r.split(" rate ")[1] for r in class_rates(ns, ifb1)] == ["10Mbit"]
        assert [r.split(" rate ")[1] for r in class_rates(ns, ifb2)] == ["20Mbit"]
        bw.release_vm_bandwidth(qs, "vm2")
        assert set(ifbs(ns)) == {ifb1}
        assert [r.split(" rate ")[1] for r in class_rates(ns, ifb1)] == ["10Mbit"]
    finally:
        host.close()
