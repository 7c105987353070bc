"""Persistence of pools, grants, attachments and bandwidth events (SQLite, plugins/module_utils/host/qos_store.py)."""

from __future__ import annotations

import sqlite3

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import QoSStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q


@pytest.fixture
def host_store(tmp_path):
    store = HostStore(str(tmp_path / "s.db"))
    yield store
    store.close()


@pytest.fixture
def conn(host_store):
    return host_store.conn


def test_state_survives_reopening_and_events_are_recorded(tmp_path, conn):
    qs = QoSStore(conn)
    assert qs.configure(1000, 1.5, {"p": 100}) == ["node 1000 Mbit/s x 1.5", "pool p 100 Mbit/s"]
    assert qs.configure(1000, 1.5, {"p": 100}) == []
    before = qs.load()
    after, d = q.request(before, q.Request("a", 10, 60, 1, "p"))
    qs.save_grants(before, after)
    qs.record(d, q.Request("a", 10, 60, 1, "p"))
    qs.attach("a", "ns1", "tap0", "zqi0", "02:00:00:00:00:01", None)
    conn.close()
    again = QoSStore(HostStore(str(tmp_path / "s.db")).conn)
    assert again.load() == after
    assert again.attachment("a").minor == 0x10
    [ev] = again.events("a")
    assert (ev["kind"], ev["subject"], ev["reason"]) == ("Normal", "vm/a", "BandwidthGranted")
    assert ev["data"]["granted_mbps"] == 50


def test_preemption_is_recorded_for_the_winner_and_the_loser(conn):
    qs = QoSStore(conn)
    qs.configure(1000, 1.0, {"p": 100})
    s0 = qs.load()
    s1, _ = q.request(s0, q.Request("low", 10, 100, 0, "p"))
    s2, d = q.request(s1, q.Request("high", 10, 50, 9, "p"))
    qs.save_grants(s0, s2)
    qs.record(d)
    assert [(e["subject"], e["reason"]) for e in qs.events()] == [("vm/high", "BandwidthPreempted"),
                                                                 ("vm/low", "BandwidthPreempted")]
    assert qs.events("low")[0]["data"] == {"by": "high", "lost_mbps": 50, "vm": "low"}


def test_capacity_below_usage_is_refused_with_the_numbers(conn):
    qs = QoSStore(conn)
    qs.configure(1000, 1.0, {"p": 100})
    s0 = qs.load()
    s1, _ = q.request(s0, q.Request("a", 30, 80, 0, "p"))
    qs.save_grants(s0, s1)
    with pytest.raises(q.QoSInputError, match=r"pools\[p\].capacity_mbps: 50 is below the 80 Mbit/s in use"):
        qs.configure(1000, 1.0, {"p": 50})
    with pytest.raises(q.QoSInputError, match="still used by admitted VMs"):
        qs.configure(1000, 1.0, {"other": 50})
    assert qs.load().pools["p"].capacity_mbps == 100  # nothing half-applied


def test_attachment_minors_are_unique_per_device(conn):
    qs = QoSStore(conn)
    a = qs.attach("a", "", "tap0", "", None, "10.0.0.1")
    b = qs.attach("b", "", "tap0", "", None, "10.0.0.2")
    c = qs.attach("c", "", "tap1", "", None, "10.0.0.3")
    assert (a.minor, b.minor, c.minor) == (0x10, 0x11, 0x10)
    assert qs.attach("a", "", "tap0", "", None, "10.0.0.1").minor == 0x10


def test_a_cloudvms_bandwidth_events_have_its_subject(host_store):
    """One subject per CloudVM in the event log: its bandwidth decisions sit with its lifecycle events."""
    vm = host_store.create_vm("default", "alice", {"owner": "alice", "bootID": 0})
    uid = vm["metadata"]["uid"]
    qs = QoSStore(host_store.conn)
    qs.configure(1000, 1.0, {"p": 100})
    s0 = qs.load()
    req = q.Request(uid, 10, 60, 0, "p")
    s1, d = q.request(s0, req)
    qs.save_grants(s0, s1)
    qs.record(d, req)
    host_store.record_event("Normal", "default/alice", "Started", "boot 1")
    assert [e["reason"] for e in host_store.events("default/alice")] == ["BandwidthGranted", "Started"]
    assert [e["reason"] for e in qs.events(uid)] == ["BandwidthGranted"]
    assert qs.subject("not-a-cloudvm") == "vm/not-a-cloudvm"


def test_the_qos_state_needs_a_host_store(tmp_path):
    """The host store's migrations own every table: a bare database has no QoS tables and is refused."""
    bare = sqlite3.connect(tmp_path / "bare.db", isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="no such table: qos_node"):
        QoSStore(bare)
    bare.close()
