"""Owner authorization on Kubernetes: config/policy/owner-admission.yaml on the real kube-apiserver.

Every request is made as a real identity — the tenant's own client certificate, or the admin's client
impersonating a user and group (``Impersonate-User`` / ``Impersonate-Group``, as ``kubectl --as``) —
so the API server's authentication, RBAC and the ValidatingAdmissionPolicy all take part.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import CONTROL_PLANE_WAIT, TENANT_NAMESPACE, TENANT_USER, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import GROUP, PLURAL, VERSION, CloudVMs, api_error

pytestmark = pytest.mark.k8s

CONTROLLER = "system:serviceaccount:zjusct-cloud-system:cloudvm-controller"


@pytest.fixture
def as_user(k8s_cluster: Any, k8s_api: Any, k8s_namespace: str,
            cloudvm_crd: dict[str, Any]) -> Iterator[Callable[..., CloudVMs]]:
    """``as_user(name, group=None)``: CloudVM access as that user, who gets ``edit`` in the test namespace.

    RBAC lets every such user write CloudVMs in the namespace, so a refusal can only come from the
    owner policy.
    """
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    clients: list[Any] = []

    def _make(user: str, group: str | None = None) -> CloudVMs:
        name = f"edit-{len(clients)}"
        rbac.create_namespaced_role_binding(k8s_namespace, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        api = k8s_cluster.api_client("admin")
        api.set_default_header("Impersonate-User", user)
        if group:
            api.set_default_header("Impersonate-Group", group)
        clients.append(api)
        return CloudVMs(client.CustomObjectsApi(api))

    yield _make
    for api in clients:
        with contextlib.suppress(Exception):
            api.close()


def _refusal(call: Callable[[], Any], policy: str = "cloudvm-owner.cloud.zjusct.io") -> str:
    """The message of the API server's 403 for ``call``, which must come from ``policy``."""
    status = api_error(call)
    assert status["http_status"] == 403, status
    assert f"ValidatingAdmissionPolicy '{policy}'" in status["message"], status["message"]
    return str(status["message"])


def test_tenant_creates_own_vm_but_not_one_for_another_owner(tenant_api: Any, cvm_api: CloudVMs) -> None:
    tenant = CloudVMs(client.CustomObjectsApi(tenant_api))
    try:
        created = tenant.create(TENANT_NAMESPACE, "own-vm", owner=TENANT_USER)
        assert created["spec"]["owner"] == TENANT_USER
        message = _refusal(lambda: tenant.create(TENANT_NAMESPACE, "bobs-vm", owner="bob"))
        assert f"user {TENANT_USER} may not create CloudVM {TENANT_NAMESPACE}/bobs-vm owned by bob" in message
        assert cvm_api.get(TENANT_NAMESPACE, "bobs-vm") is None
    finally:
        with contextlib.suppress(Exception):
            cvm_api.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, "own-vm")


def test_another_user_cannot_start_change_keys_or_delete(as_user: Callable[..., CloudVMs], cvm_api: CloudVMs,
                                                         k8s_namespace: str) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    alice.create(k8s_namespace, "alice", owner="alice")
    before = cvm_api.get(k8s_namespace, "alice")
    assert before is not None

    start = _refusal(lambda: bob.patch_spec(k8s_namespace, "alice", powerState="Running", bootID=1))
    assert f"user bob may not update CloudVM {k8s_namespace}/alice owned by alice" in start
    _refusal(lambda: bob.patch_spec(k8s_namespace, "alice", sshAuthorizedKeys=["ssh-ed25519 AAAAC3Nz bob"]))
    delete = _refusal(lambda: bob.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL,
                                                                       "alice"))
    assert f"user bob may not delete CloudVM {k8s_namespace}/alice owned by alice" in delete

    after = cvm_api.get(k8s_namespace, "alice")
    assert after is not None and after["spec"] == before["spec"]
    alice.patch_spec(k8s_namespace, "alice", powerState="Running", bootID=1)
    # as the cloudvm module deletes: foreground propagation, which the garbage collector (no owner) finishes
    # by removing its finalizer, a metadata-only update the policy lets through
    alice.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "alice",
                                              body={"propagationPolicy": "Foreground"})
    wait_for(lambda: cvm_api.get(k8s_namespace, "alice") is None, 60, "alice's CloudVM deleted")


def test_owner_group_operators_and_controller_may_act(as_user: Callable[..., CloudVMs], cvm_api: CloudVMs,
                                                      k8s_namespace: str) -> None:
    as_user("alice").create(k8s_namespace, "team", owner="alice")
    teammate = as_user("carol", group="cloud.zjusct.io:owner:alice")
    assert teammate.patch_spec(k8s_namespace, "team", vcpus=2)["spec"]["vcpus"] == 2
    operator = as_user("ops", group="cloud.zjusct.io:operators")
    assert operator.patch_spec(k8s_namespace, "team", vcpus=3)["spec"]["vcpus"] == 3
    controller = as_user(CONTROLLER)
    assert controller.patch_spec(k8s_namespace, "team", vcpus=4)["spec"]["vcpus"] == 4
    # a group for another owner grants nothing
    outsider = as_user("dave", group="cloud.zjusct.io:owner:bob")
    _refusal(lambda: outsider.patch_spec(k8s_namespace, "team", vcpus=1))
    _refusal(lambda: outsider.create(k8s_namespace, "dave", owner="alice"))
    operator.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "team")
    assert cvm_api.get(k8s_namespace, "team") is None or \
        cvm_api.get(k8s_namespace, "team")["metadata"].get("deletionTimestamp")  # type: ignore[index]


def test_module_reports_the_refusal_and_changes_nothing(play: Callable[..., Any], cvm_api: CloudVMs) -> None:
    """The tenant's own playbook run against a VM of another owner in her namespace: refused, named."""
    name = "bobs-in-alices-ns"
    if cvm_api.get(TENANT_NAMESPACE, name) is None:
        cvm_api.create(TENANT_NAMESPACE, name, owner="bob")
    try:
        run = play([
            {"zjusct.cloud.cloudvm": {"name": name, "namespace": TENANT_NAMESPACE, "power_state": "running",
                                      "wait": False}},
            {"zjusct.cloud.cloudvm": {"name": name, "namespace": TENANT_NAMESPACE, "state": "absent",
                                      "wait": False}},
        ], user=TENANT_USER)
        start, delete = run.results
        for result, verb in ((start, "update"), (delete, "delete")):
            assert result.get("failed") is True and result.get("api_status") == 403, result
            assert f"user {TENANT_USER} may not {verb} CloudVM {TENANT_NAMESPACE}/{name} owned by bob" \
                in result["msg"], result["msg"]
        vm = cvm_api.get(TENANT_NAMESPACE, name)
        assert vm is not None and vm["spec"]["powerState"] == "Stopped" and vm["spec"]["bootID"] == 0
    finally:
        with contextlib.suppress(Exception):
            cvm_api.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, name)


# --------------------------------------------------------------------------- metadata, claims, launcher Pods

CLAIM_POLICY = "root-volume-claim.cloud.zjusct.io"
POD_POLICY = "launcher-pod.cloud.zjusct.io"
DEPENDENT_POLICY = "cloudvm-dependent.cloud.zjusct.io"
OPERATORS = "cloud.zjusct.io:operators"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
PROTECTED_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")


def _core(user: CloudVMs) -> Any:
    """CoreV1Api with the identity of ``user`` (an :func:`as_user` client)."""
    return client.CoreV1Api(user.api.api_client)


def _patch_meta(user: CloudVMs, ns: str, name: str, meta: dict[str, Any]) -> dict[str, Any]:
    """A merge patch of a CloudVM's metadata (lists such as finalizers are replaced whole)."""
    return dict(user.api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"metadata": meta}))


def _protected(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: obj["metadata"].get(k) for k in PROTECTED_METADATA}


def test_another_user_cannot_change_the_finalizers_annotations_labels_or_owner_references_of_a_cloudvm(
        as_user: Callable[..., CloudVMs], cvm_api: CloudVMs, k8s_namespace: str) -> None:
    """issue 39 input 2: bob, with ``edit`` in the namespace alice shares, writes alice's CloudVM's metadata."""
    ns = k8s_namespace
    alice, bob = as_user("alice"), as_user("bob")
    alice.create(ns, "alice", owner="alice")
    _patch_meta(alice, ns, "alice", {"finalizers": ["example.com/alice-hold"], "labels": {"course": "os"},
                                     "annotations": {"note": "mine"}})  # the owner's own metadata
    bobs = _core(bob).create_namespaced_config_map(ns, {"metadata": {"name": "bobs"}})
    before = cvm_api.get(ns, "alice")
    assert before is not None
    attempts = [
        ("metadata.finalizers", {"finalizers": ["example.com/alice-hold", "example.com/bob-hold"]}),
        ("metadata.finalizers", {"finalizers": None}),
        ("metadata.annotations", {"annotations": {"kopf.zalando.org/last-handled-configuration": "{}"}}),
        ("metadata.annotations", {"annotations": {"note": None}}),
        ("metadata.labels", {"labels": {"course": "bob"}}),
        ("metadata.ownerReferences", {"ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "bobs", "uid": bobs.metadata.uid}]}),
    ]
    for field, meta in attempts:
        message = _refusal(lambda meta=meta: _patch_meta(bob, ns, "alice", meta))  # type: ignore[misc]
        assert (f"spec.owner: user bob may not update CloudVM {ns}/alice owned by alice, which changes {field} "
                "(allowed: that user, members of group cloud.zjusct.io:owner:alice, and the operators group "
                "cloud.zjusct.io:operators)") in message, message
    after = cvm_api.get(ns, "alice")
    assert after is not None and _protected(after) == _protected(before)

    # the owner's group, an operator and the controller may; a no-op update passes for anyone
    _patch_meta(as_user("carol", group="cloud.zjusct.io:owner:alice"), ns, "alice", {"annotations": {"by": "carol"}})
    _patch_meta(as_user("ops", group=OPERATORS), ns, "alice", {"labels": {"course": "ops"}})
    _patch_meta(as_user(CONTROLLER), ns, "alice", {"finalizers": ["example.com/alice-hold", "example.com/ctl"]})
    _patch_meta(bob, ns, "alice", {"labels": {"course": "ops"}})
    got = cvm_api.get(ns, "alice")
    assert got is not None and got["metadata"]["annotations"]["by"] == "carol"
    assert got["metadata"]["labels"]["course"] == "ops"
    assert got["metadata"]["finalizers"] == ["example.com/alice-hold", "example.com/ctl"]


def test_the_garbage_collector_and_namespace_controller_only_do_their_own_operations(
        as_user: Callable[..., CloudVMs], cvm_api: CloudVMs, k8s_namespace: str) -> None:
    """Their identities (kube-controller-manager --use-service-account-credentials, tests/cluster) are allowed what
    they do - the garbage collector takes finalizers and ownerReferences away and deletes, the namespace controller
    deletes in a namespace being deleted - and nothing else."""
    ns = k8s_namespace
    as_user("alice").create(ns, "alice", owner="alice")
    _patch_meta(as_user("ops", group=OPERATORS), ns, "alice", {"finalizers": ["example.com/a", "example.com/b"]})
    gc, nsc = as_user(GC), as_user(NAMESPACE_CONTROLLER)
    message = _refusal(lambda: _patch_meta(gc, ns, "alice", {"finalizers": ["example.com/a", "example.com/b",
                                                                               "example.com/gc"]}))
    assert f"user {GC} may not update CloudVM {ns}/alice owned by alice, which changes metadata.finalizers" in message
    _refusal(lambda: _patch_meta(gc, ns, "alice", {"labels": {"x": "y"}}))
    took = _patch_meta(gc, ns, "alice", {"finalizers": ["example.com/a"]})
    assert took["metadata"]["finalizers"] == ["example.com/a"]
    # the namespace is not being deleted: the namespace controller has nothing to delete here
    message = _refusal(lambda: nsc.api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "alice"))
    assert f"user {NAMESPACE_CONTROLLER} may not delete CloudVM {ns}/alice owned by alice" in message
    _patch_meta(gc, ns, "alice", {"finalizers": None})
    gc.api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "alice")
    wait_for(lambda: cvm_api.get(ns, "alice") is None, CONTROL_PLANE_WAIT,
             "alice's CloudVM deleted as the garbage collector")


def test_the_garbage_collector_deletes_a_cloudvm_whose_owner_made_it_depend_on_her_object(
        as_user: Callable[..., CloudVMs], cvm_api: CloudVMs, k8s_namespace: str) -> None:
    """The owner may make her CloudVM a dependent of an object of her own; when that goes, the real garbage
    collector's delete of the CloudVM is admitted (on main it was refused and retried forever)."""
    ns = k8s_namespace
    alice = as_user("alice")
    alice.create(ns, "alice", owner="alice")
    mine = _core(alice).create_namespaced_config_map(ns, {"metadata": {"name": "alices"}})
    _patch_meta(alice, ns, "alice", {"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "alices", "uid": mine.metadata.uid}]})
    _core(alice).delete_namespaced_config_map("alices", ns)

    def gone() -> bool:
        vm = cvm_api.get(ns, "alice")
        last["vm"] = vm and vm["metadata"]
        return vm is None

    last: dict[str, Any] = {}
    try:
        # the garbage collector picks the CloudVM up from its informers (its monitors resync discovery every 30 s)
        wait_for(gone, 180, "alice's CloudVM deleted by the garbage collector")
    except TimeoutError as exc:
        raise AssertionError(f"CloudVM still there after 180 s: {last}") from exc


@pytest.fixture
def alices_claim(k8s_api: Any, k8s_namespace: str) -> str:
    """A root volume claim ``alice-root`` as root_volume_claim leaves it (owner mark alice) with the controller's
    claim mark, made by the admin; it stays Pending (no PV), which no check here needs."""
    client.CoreV1Api(k8s_api).create_namespaced_persistent_volume_claim(k8s_namespace, {
        "metadata": {"name": "alice-root", "labels": {"cloud.zjusct.io/owner": "alice"},
                     "annotations": {"cloud.zjusct.io/claimed-by": "uid-of-alices-vm"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}})
    return "alice-root"


def _claim_body(name: str, owner: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"cloud.zjusct.io/owner": owner}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}}


def test_another_user_cannot_change_the_marks_of_or_delete_a_claim_of_another_owner(
        as_user: Callable[..., CloudVMs], k8s_api: Any, k8s_namespace: str, alices_claim: str) -> None:
    ns, claim = k8s_namespace, alices_claim
    admin = client.CoreV1Api(k8s_api)
    alice, bob = _core(as_user("alice")), _core(as_user("bob"))
    before = admin.read_namespaced_persistent_volume_claim(claim, ns).metadata
    bobs = bob.create_namespaced_config_map(ns, {"metadata": {"name": "bobs"}})

    def patch(api: Any, meta: dict[str, Any]) -> Any:
        return api.patch_namespaced_persistent_volume_claim(claim, ns, {"metadata": meta})

    message = _refusal(lambda: patch(bob, {"labels": {"cloud.zjusct.io/owner": "bob"}}), CLAIM_POLICY)
    assert (f"metadata.labels[cloud.zjusct.io/owner]: user bob may not change the owner mark of "
            f'PersistentVolumeClaim {ns}/{claim} from "alice" to "bob"') in message, message
    message = _refusal(lambda: patch(bob, {"annotations": {"cloud.zjusct.io/claimed-by": None}}), CLAIM_POLICY)
    assert (f"metadata.annotations[cloud.zjusct.io/claimed-by]: user bob may not remove the claim mark of "
            f"PersistentVolumeClaim {ns}/{claim} owned by alice") in message, message
    for field, meta in (("metadata.finalizers", {"finalizers": ["kubernetes.io/pvc-protection", "example.com/bob"]}),
                        ("metadata.labels", {"labels": {"team": "bob"}}),
                        ("metadata.ownerReferences", {"ownerReferences": [
                            {"apiVersion": "v1", "kind": "ConfigMap", "name": "bobs", "uid": bobs.metadata.uid}]})):
        message = _refusal(lambda meta=meta: patch(bob, meta), CLAIM_POLICY)  # type: ignore[misc]
        assert (f"user bob may not update PersistentVolumeClaim {ns}/{claim} owned by alice, which changes {field} "
                "(allowed: that user, members of group cloud.zjusct.io:owner:alice, and the operators group "
                "cloud.zjusct.io:operators)") in message, message
    message = _refusal(lambda: bob.delete_namespaced_persistent_volume_claim(claim, ns), CLAIM_POLICY)
    assert f"user bob may not delete PersistentVolumeClaim {ns}/{claim} owned by alice" in message, message
    message = _refusal(lambda: bob.create_namespaced_persistent_volume_claim(ns, _claim_body("fake", "alice")),
                       CLAIM_POLICY)
    assert f"user bob may not create PersistentVolumeClaim {ns}/fake with the owner mark alice" in message
    after = admin.read_namespaced_persistent_volume_claim(claim, ns).metadata
    assert (after.labels, after.annotations, after.finalizers, after.owner_references) == (
        before.labels, before.annotations, before.finalizers, before.owner_references)

    # the marks are the control plane's, even for the owner; the rest of her claim is hers
    _refusal(lambda: patch(alice, {"annotations": {"cloud.zjusct.io/claimed-by": None}}), CLAIM_POLICY)
    _refusal(lambda: patch(alice, {"labels": {"cloud.zjusct.io/owner": "bob"}}), CLAIM_POLICY)
    patch(alice, {"labels": {"team": "a"}})
    bob.create_namespaced_persistent_volume_claim(ns, _claim_body("bobs-own", "bob"), dry_run="All")
    controller = _core(as_user(CONTROLLER))
    patch(controller, {"annotations": {"cloud.zjusct.io/claimed-by": "uid-of-alices-next-vm"}})
    _refusal(lambda: patch(controller, {"labels": {"cloud.zjusct.io/owner": "bob"}}), CLAIM_POLICY)
    # an operator hands the disk to carol (as vm_restore's allow_owner_change with operator=true): carol's now
    patch(_core(as_user("ops", group=OPERATORS)), {"labels": {"cloud.zjusct.io/owner": "carol"}})
    _refusal(lambda: alice.delete_namespaced_persistent_volume_claim(claim, ns), CLAIM_POLICY)
    _core(as_user("carol")).delete_namespaced_persistent_volume_claim(claim, ns)

    def gone() -> bool:  # the pvc-protection controller takes its finalizer away
        try:
            admin.read_namespaced_persistent_volume_claim(claim, ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, CONTROL_PLANE_WAIT, f"claim {claim} deleted")


def test_only_the_controller_and_operators_make_an_object_a_dependent_of_a_cloudvm(
        as_user: Callable[..., CloudVMs], k8s_namespace: str) -> None:
    """An ownerReference to alice's CloudVM with blockOwnerDeletion on bob's object (with a finalizer of his)
    would hold her foreground delete for ever."""
    ns = k8s_namespace
    alice, bob = as_user("alice"), as_user("bob")
    vm = alice.create(ns, "alice", owner="alice")
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "name": "alice", "uid": vm["metadata"]["uid"],
           "blockOwnerDeletion": True}
    hold = {"metadata": {"name": "hold", "finalizers": ["example.com/hold"], "ownerReferences": [ref]}}
    message = _refusal(lambda: _core(bob).create_namespaced_config_map(ns, hold), DEPENDENT_POLICY)
    assert (f"metadata.ownerReferences: user bob may not make configmaps {ns}/hold a dependent of CloudVM "
            f"{ns}/alice") in message, message
    _core(bob).create_namespaced_config_map(ns, {"metadata": {"name": "plain"}})
    _refusal(lambda: _core(bob).patch_namespaced_config_map("plain", ns, {"metadata": {"ownerReferences": [ref]}}),
             DEPENDENT_POLICY)
    _refusal(lambda: _core(alice).create_namespaced_config_map(ns, hold), DEPENDENT_POLICY)  # the owner's too
    # other ownerReferences are nobody's business here
    plain = _core(bob).read_namespaced_config_map("plain", ns)
    _core(bob).create_namespaced_config_map(ns, {"metadata": {"name": "child", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "plain", "uid": plain.metadata.uid}]}})
    _core(as_user("ops", group=OPERATORS)).create_namespaced_config_map(
        ns, {"metadata": {"name": "hold", "ownerReferences": [ref]}}, dry_run="All")


def _connect_status(call: Callable[[], Any]) -> tuple[int, str]:
    """(HTTP status, body) of the error a CONNECT (exec, attach, port-forward, proxy) without a stream upgrade gets:
    the policy answers before the API server tries the kubelet."""
    with pytest.raises(ApiException) as err:
        call()
    body = str(err.value.body)
    with contextlib.suppress(ValueError):  # a Status object; other answers are plain text
        body = str(json.loads(body).get("message", body))
    return err.value.status, body


def test_another_user_cannot_delete_exec_into_or_change_a_launcher_pod(
        controller: Any, as_user: Callable[..., CloudVMs], cvm_api: CloudVMs, k8s_api: Any, k8s_namespace: str,
        bound_claim: Callable[[str, str], str]) -> None:
    """A real launcher Pod of alice's VM (the real controller's; unscheduled here): bob, with ``edit`` in the
    namespace, may neither delete nor change it, nor exec, attach, port-forward, proxy or evict it, nor forge one."""
    ns = k8s_namespace
    alice, bob, ops = as_user("alice"), as_user("bob"), as_user("ops", group=OPERATORS)
    admin, bcore, acore = client.CoreV1Api(k8s_api), _core(bob), _core(alice)
    bound_claim("web-root", "alice")
    alice.create(ns, "web", owner="alice", powerState="Running", bootID=1)
    pod = wait_for(lambda: next(iter(admin.list_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm=web").items),
                                None), CONTROL_PLANE_WAIT, "the controller's launcher Pod")
    name = pod.metadata.name
    assert name == "web-boot-1" and pod.metadata.labels["cloud.zjusct.io/owner"] == "alice"

    message = _refusal(lambda: bcore.delete_namespaced_pod(name, ns), POD_POLICY)
    assert (f"metadata.labels[cloud.zjusct.io/owner]: user bob may not delete launcher Pod {ns}/{name} of CloudVM "
            f"{ns}/web owned by alice (allowed: that user, members of group cloud.zjusct.io:owner:alice, the "
            "CloudVM controller and the operators group cloud.zjusct.io:operators)") in message, message
    for field, body in (("metadata.labels", {"metadata": {"labels": {"cloud.zjusct.io/vm": None}}}),
                        ("metadata.annotations", {"metadata": {"annotations": {"cloud.zjusct.io/launcher-config":
                                                                                 "{}"}}}),
                        ("spec", {"spec": {"containers": [{"name": "launcher", "image": "bob/evil:1"}]}})):
        message = _refusal(lambda body=body: bcore.patch_namespaced_pod(name, ns, body), POD_POLICY)  # type: ignore[misc]
        assert f"user bob may not update launcher Pod {ns}/{name} of owner alice, which changes {field}" in message
    connects = {
        "exec into": lambda api: api.connect_post_namespaced_pod_exec(name, ns, command=["true"], stdout=True),
        "attach to": lambda api: api.connect_post_namespaced_pod_attach(name, ns, stdout=True),
        "port-forward to": lambda api: api.connect_post_namespaced_pod_portforward(name, ns, ports="22"),
        "proxy to": lambda api: api.connect_get_namespaced_pod_proxy(name, ns),
        "evict": lambda api: api.create_namespaced_pod_eviction(name, ns, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}),
    }
    for verb, call in connects.items():
        status, body = _connect_status(lambda call=call: call(bcore))  # type: ignore[misc]
        assert status == 403 and f"ValidatingAdmissionPolicy '{POD_POLICY}'" in body, (verb, status, body)
        assert f"user bob may not {verb} Pod {ns}/{name}: a Pod named <vm>-boot-<bootID> is a CloudVM launcher" \
            in body, body
        # the owner's too: her way in is SSH into the guest
        status, body = _connect_status(lambda call=call: call(acore))  # type: ignore[misc]
        assert status == 403 and f"user alice may not {verb} Pod" in body, (verb, status, body)
    for forged in ({"labels": {"cloud.zjusct.io/vm": "web", "cloud.zjusct.io/boot-id": "2"}},
                   {"annotations": {"cloud.zjusct.io/root-claim": "web-root"}},
                   {"labels": {"app.kubernetes.io/managed-by": "zjusct-controller"}}):
        message = _refusal(lambda forged=forged: bcore.create_namespaced_pod(ns, {  # type: ignore[misc]
            "metadata": {"name": "fake", **forged},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}}), POD_POLICY)
        assert f"user bob may not create Pod {ns}/fake with the marks of a CloudVM launcher" in message, message
    after = admin.read_namespaced_pod(name, ns)
    assert (after.metadata.uid, after.metadata.labels, after.metadata.annotations, after.spec.containers[0].image) \
        == (pod.metadata.uid, pod.metadata.labels, pod.metadata.annotations, pod.spec.containers[0].image)
    assert admin.list_namespaced_pod(ns, field_selector="metadata.name=fake").items == []

    # the policy lets an operator through (what follows is the API server's own answer: the Pod has no node)
    status, body = _connect_status(lambda: _core(ops).connect_post_namespaced_pod_exec(name, ns, command=["true"],
                                                                                        stdout=True))
    assert POD_POLICY not in body and status != 403, (status, body)
    # a Pod of the tenant's own may be named anything else and is his to exec into and delete
    bcore.create_namespaced_pod(ns, {"metadata": {"name": "bobs"},
                                     "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}})
    status, body = _connect_status(lambda: bcore.connect_post_namespaced_pod_exec("bobs", ns, command=["true"],
                                                                                  stdout=True))
    assert POD_POLICY not in body and status != 403, (status, body)
    bcore.delete_namespaced_pod("bobs", ns, grace_period_seconds=0)
    # the owner may delete her launcher Pod: the VM then reports its launcher lost
    acore.delete_namespaced_pod(name, ns)
    wait_for(lambda: not admin.list_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm=web").items,
             CONTROL_PLANE_WAIT, "alice's launcher Pod deleted")
    vm = wait_for(lambda: (cvm_api.get(ns, "web") or {}).get("status", {}).get("reason") == "LauncherLost"
                  and cvm_api.get(ns, "web"), CONTROL_PLANE_WAIT, "web reports LauncherLost")
    assert vm["status"]["phase"] == "Failed"
