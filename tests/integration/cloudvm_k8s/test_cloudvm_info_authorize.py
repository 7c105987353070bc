"""cloudvm_info's ``authorize`` on the real kube-apiserver with the owner policy applied: the owner check the
vm_stop / vm_restart / vm_backup playbooks make when they look a VM up is asked of the API server (a server-side
dry run, so its audit log records a refusal) and refuses another owner's VM; nothing is stored either way.

Users: ``alice`` with her own client certificate and ``edit`` in her tenant namespace (tests/cluster), the admin
(``system:masters``, exempt from the policy as an operator).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster import TENANT_NAMESPACE
from tests.integration.cloudvm_k8s.cloudvm_helpers import CloudVMs

pytestmark = pytest.mark.k8s

AUTHORIZE_LABEL = "cloud.zjusct.io/authorized-for"


@pytest.fixture
def vms(cvm_api: CloudVMs) -> Iterator[Callable[[str], str]]:
    """``vms(owner)``: a Stopped CloudVM of ``owner`` in alice's tenant namespace (created by the admin); deleted
    afterwards."""
    made: list[str] = []

    def _make(owner: str) -> str:
        name = f"{owner}-{uuid.uuid4().hex[:6]}"
        cvm_api.create(TENANT_NAMESPACE, name, owner=owner)
        made.append(name)
        return name

    yield _make
    for name in made:
        cvm_api.api.delete_namespaced_custom_object("cloud.zjusct.io", "v1alpha1", TENANT_NAMESPACE, "cloudvms", name)


def _lookup(name: str, owner: str, operator: bool = False) -> dict[str, Any]:
    return {"zjusct.cloud.cloudvm_info": {"name": name, "namespace": TENANT_NAMESPACE,
                                          "authorize": {"owner": owner, "operator": operator, "action": "stop"}}}


def test_the_api_server_refuses_a_lookup_for_another_owners_vm_and_stores_nothing(
    play: Callable[..., Any], cvm_api: CloudVMs, vms: Callable[[str], str],
) -> None:
    bobs, hers = vms("bob"), vms("alice")
    refused, own = play([_lookup(bobs, "alice"), _lookup(hers, "alice")], user="alice").results
    assert refused.get("failed") and refused["reason"] == "Forbidden", refused
    assert f"owner: 'alice' may not act on CloudVM {TENANT_NAMESPACE}/{bobs}, which belongs to owner 'bob'" \
        in refused["msg"], refused["msg"]
    # the API server decided too: the owner policy refused the dry run made with alice's own certificate
    assert "cloudvm-owner.cloud.zjusct.io" in refused["api_message"] and "user alice" in refused["api_message"]
    assert not own.get("failed") and [vm["metadata"]["name"] for vm in own["cloudvms"]] == [hers], own
    for name in (bobs, hers):  # a dry run stores nothing
        vm = cvm_api.get(TENANT_NAMESPACE, name)
        assert vm is not None and AUTHORIZE_LABEL not in (vm["metadata"].get("labels") or {}), vm


def test_an_operator_may_look_up_any_vm_for_acting_on_it(play: Callable[..., Any], vms: Callable[[str], str]) -> None:
    bobs = vms("bob")
    (found,) = play([_lookup(bobs, "ops", operator=True)], user="admin").results
    assert not found.get("failed") and found["cloudvms"][0]["spec"]["owner"] == "bob", found
