"""The tc_qos ``requests`` form (host.tc_qos_module.arbitrate) decides as one request() after the other would, in one
batch; duplicates and invalid values are refused with the field named. Pure; no timing here (bench/)."""

from __future__ import annotations

import random

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import tc_qos_module as m
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q


def _params(n: int, seed: int) -> dict:
    rnd = random.Random(seed)
    reqs = []
    for i in range(n):
        g = rnd.randint(1, 50)
        reqs.append({"vm": f"vm{i}", "guaranteed_mbps": g, "ceil_mbps": g + rnd.randint(0, 200),
                     "priority": rnd.randint(0, 5), "pool": f"p{i % 3}",
                     "match": {"mac": f"02:7a:00:00:{i >> 8:02x}:{i & 0xff:02x}"}})
    return {"node": {"nic_mbps": 3000, "ratio": 1.0},
            "pools": [{"name": f"p{i}", "capacity_mbps": 600} for i in range(3)], "requests": reqs}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_requests_form_equals_one_request_after_the_other(seed):
    params = _params(120, seed)
    specs, decisions, reqs = m.arbitrate(params)
    state = q.State(q.NodeCapacity(3000, 1.0), {f"p{i}": q.Pool(f"p{i}", 600) for i in range(3)})
    expected = []
    for r in reqs:
        state, d = q.request(state, r)
        expected.append(d)
    assert decisions == expected
    outcomes = {d.outcome for d in decisions}
    assert {q.GRANTED, q.PREEMPTED, q.DENIED} <= outcomes  # the inputs exercise every rule
    assert [(s.name, s.rate_mbps, s.ceil_mbps) for s in specs] == \
        [(c.vm, c.rate_mbps, c.ceil_mbps) for c in q.desired_rates(state)]
    by_vm = {r["vm"]: r["match"]["mac"] for r in params["requests"]}
    assert all(s.mac == by_vm[s.name] for s in specs)


def test_duplicate_vm_is_refused_naming_the_index():
    params = _params(5, 1)
    params["requests"].append(dict(params["requests"][2]))
    with pytest.raises(q.QoSInputError, match=r"requests\[5\]\.vm: 'vm2' appears twice"):
        m.arbitrate(params)


def test_invalid_request_names_the_field_and_range():
    params = _params(5, 1)
    params["requests"][3]["ceil_mbps"] = 601
    with pytest.raises(q.QoSInputError, match=r"vm3\.ceil_mbps: 601 is above the capacity 600 of pool p0"):
        m.arbitrate(params)
