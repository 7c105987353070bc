"""network.tc_netlink.BoundedIPRoute: a netlink request that never gets an answer ends at its deadline; a read is
retried once on a new IPRoute, a write is not (fakes stand in for pyroute2: a hang cannot be made on demand)."""

from __future__ import annotations

import time

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink
from ansible_collections.zjusct.cloud.plugins.module_utils.network.tc import TcError

# the deadline is a SIGALRM timer, which pytest-timeout's signal method would hold already (then no deadline is set)
pytestmark = pytest.mark.timeout(120, method="thread")


class Hanging:
    """An IPRoute whose first ``hangs`` requests (over all instances) wait for ever."""

    made: list = []

    def __init__(self, hangs: int) -> None:
        self.hangs, self.closed = hangs, False
        Hanging.made.append(self)

    def _maybe_hang(self) -> None:
        if Hanging.made.index(self) < self.hangs:
            time.sleep(3600)

    def link_lookup(self, ifname: str) -> list:
        self._maybe_hang()
        return [7]

    def nlm_request_batch(self, msgs: list):
        self._maybe_hang()
        yield from msgs

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setattr(tc_netlink, "REQUEST_TIMEOUT", 0.3)
    Hanging.made = []


def test_a_read_without_answer_is_retried_on_a_new_iproute():
    ipr = tc_netlink.BoundedIPRoute(lambda: Hanging(hangs=1), "netns t")
    started = time.monotonic()
    assert ipr.link_lookup(ifname="lo") == [7]
    assert time.monotonic() - started < 5
    assert len(Hanging.made) == 2 and Hanging.made[0].closed


def test_a_read_without_answer_twice_fails_naming_it_and_the_namespace():
    ipr = tc_netlink.BoundedIPRoute(lambda: Hanging(hangs=5), "netns t")
    with pytest.raises(TcError, match=r"link_lookup in netns t got no answer within 0.3 s \(twice\)"):
        ipr.link_lookup(ifname="lo")


def test_a_write_without_answer_is_not_repeated():
    ipr = tc_netlink.BoundedIPRoute(lambda: Hanging(hangs=1), "netns t")
    with pytest.raises(TcError, match="nlm_request_batch in netns t got no answer"):
        ipr.nlm_request_batch(["m1", "m2"])
    assert ipr.nlm_request_batch(["m1"]) == ["m1"]  # the next request goes to the new IPRoute


def test_an_answer_in_time_leaves_no_alarm_behind():
    import signal

    ipr = tc_netlink.BoundedIPRoute(lambda: Hanging(hangs=0), "netns t")
    assert ipr.link_lookup(ifname="lo") == [7]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
