"""The zjusct.cloud.cloudvm inventory against the real kube-apiserver (tests/cluster).

No CloudVM controller runs here: the tests create CloudVMs as a user would and write their status
through the status subresource as the controller would (CloudVMWriter.report).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE
from tests.integration.inventory_k8s.inventory_k8s_helpers import (
    GROUP,
    PLURAL,
    REPO,
    UNSAFE,
    VERSION,
    ansible_env,
    names,
    run_inventory,
    run_playbook,
    start_vm_command,
    write_inventory,
)

pytestmark = pytest.mark.k8s


def source(tmp_path: Path, kubeconfig: Path, **options: Any) -> Path:
    return write_inventory(tmp_path / "test.cloudvm.yml", kubeconfig=str(kubeconfig), **options)


def test_zero_cloudvms_give_an_empty_inventory(k8s_cluster, vms, k8s_namespace, tmp_path):
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace]))
    assert run.hosts() == set()


def test_one_running_cloudvm_becomes_a_host_with_ssh_vars_and_groups(k8s_cluster, vms, k8s_namespace, tmp_path):
    vms.create(k8s_namespace, "web", owner="bob-smith", labels={"course": "os"}, vcpus=2, memory_mib=1024)
    vms.report(k8s_namespace, "web", "Running", ip="192.0.2.20", port=2222, node="node-a")
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace]))
    host = f"web.{k8s_namespace}"
    assert run.hosts() == {host}
    hv = run.hostvars(host)
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("192.0.2.20", 2222, "root")
    assert hv["cloudvm_owner"] == "bob-smith" and hv["cloudvm_vcpus"] == 2 and hv["cloudvm_memory_mib"] == 1024
    assert hv["cloudvm_node"] == "node-a" and hv["cloudvm_boot_id"] == 1 and hv["cloudvm_phase"] == "Running"
    assert hv["cloudvm_labels"] == {"course": "os"} and hv["cloudvm_namespace"] == k8s_namespace
    assert run.group("owner_bob_smith") == {host}
    assert run.group("node_node_a") == {host}
    assert run.group("namespace_" + k8s_namespace.replace("-", "_")) == {host}


def test_only_running_cloudvms_are_listed_by_default(k8s_cluster, vms, k8s_namespace, tmp_path):
    for name, phase in (("up", "Running"), ("booting", "Pending"), ("off", "Stopped"), ("broken", "Failed")):
        vms.create(k8s_namespace, name)
        vms.report(k8s_namespace, name, phase)
    vms.create(k8s_namespace, "new")  # no status yet
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace]))
    assert run.hosts() == names(["up"], k8s_namespace)
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace],
                               include_phases=["Running", "Pending"]))
    assert run.hosts() == names(["up", "booting"], k8s_namespace)
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], include_all=True,
                               group_by=["phase"]))
    assert run.hosts() == names(["up", "booting", "off", "broken", "new"], k8s_namespace)
    assert run.group("phase_Stopped") == names(["off"], k8s_namespace)


def test_many_cloudvms_are_listed_in_pages_not_one_request_per_vm(k8s_cluster, vms, k8s_namespace, tmp_path):
    count, page = 120, 50
    for i in range(count):
        vms.start(k8s_namespace, f"vm-{i:03d}", owner=f"user{i % 3}")
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], page_size=page),
                        "-vvv")
    assert run.hosts() == names([f"vm-{i:03d}" for i in range(count)], k8s_namespace)
    assert len(run.group("owner_user0")) == 40
    match = re.search(r"(\d+) CloudVMs in (\d+) list requests", run.stdout + run.stderr)
    assert match is not None, run.stderr[-2000:]
    assert (int(match.group(1)), int(match.group(2))) == (count, 3)  # ceil(120 / 50) pages, one namespace


def test_cluster_wide_list_with_label_selector_and_owner_filter(k8s_cluster, vms, k8s_api, tmp_path):
    mark = uuid.uuid4().hex[:8]
    core = client.CoreV1Api(k8s_api)
    spaces = [f"inv-wide-{mark}-{i}" for i in range(2)]
    for ns in spaces:
        core.create_namespace({"metadata": {"name": ns}})
    try:
        vms.start(spaces[0], "a", owner="alice", labels={"run": mark, "tier": "web"})
        vms.start(spaces[1], "b", owner="bob", labels={"run": mark, "tier": "db"})
        vms.start(spaces[1], "c", owner="alice", labels={"other": mark})
        wide = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, label_selector=f"run={mark}"))
        assert wide.hosts() == {f"a.{spaces[0]}", f"b.{spaces[1]}"}
        sel = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, label_selector=f"run={mark},tier in (db)"))
        assert sel.hosts() == {f"b.{spaces[1]}"}
        # one owner: filtered by the server through the CRD's selectable field spec.owner
        own = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=spaces, owners=["alice"]))
        assert own.hosts() == {f"a.{spaces[0]}", f"c.{spaces[1]}"}
    finally:
        for ns in spaces:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)


def test_compose_groups_and_keyed_groups(k8s_cluster, vms, k8s_namespace, tmp_path):
    vms.start(k8s_namespace, "small", labels={"course": "os"}, memory_mib=512)
    vms.start(k8s_namespace, "large", labels={"course": "db"}, vcpus=4, memory_mib=4096)
    run = run_inventory(source(
        tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], hostname_format="{namespace}-{name}",
        compose={"memory_gib": "cloudvm_memory_mib // 1024", "ansible_python_interpreter": "'/usr/bin/python3'"},
        groups={"big": "cloudvm_memory_mib >= 2048"},
        keyed_groups=[{"key": "cloudvm_labels.course", "prefix": "course"}], strict=True))
    small, large = f"{k8s_namespace}-small", f"{k8s_namespace}-large"
    assert run.hosts() == {small, large}
    assert run.hostvars(large)["memory_gib"] == 4 and run.hostvars(small)["memory_gib"] == 0
    assert run.hostvars(small)["ansible_python_interpreter"] == "/usr/bin/python3"
    assert run.group("big") == {large}
    assert run.group("course_os") == {small} and run.group("course_db") == {large}


def test_nested_layout_one_cloudvm_dict_that_compose_and_keyed_groups_read(k8s_cluster, vms, k8s_namespace,
                                                                            tmp_path):
    vms.create(k8s_namespace, "web", owner="bob-smith", labels={"course": "os"}, vcpus=2, memory_mib=4096)
    vms.report(k8s_namespace, "web", "Running", ip="192.0.2.21", port=2222, node="node-a")
    vms.start(k8s_namespace, "small", labels={"course": "db"}, memory_mib=512)
    run = run_inventory(source(
        tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], hostvars_layout="nested",
        compose={"memory_gib": "cloudvm.memory_mib // 1024"}, groups={"big": "cloudvm.memory_mib >= 2048"},
        keyed_groups=[{"key": "cloudvm.labels.course", "prefix": "course"}], strict=True))
    web, small = f"web.{k8s_namespace}", f"small.{k8s_namespace}"
    assert run.hosts() == {web, small}
    hv = run.hostvars(web)
    assert set(hv) == {"ansible_host", "ansible_port", "ansible_user", "cloudvm", "memory_gib"}
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("192.0.2.21", 2222, "root")
    uid = vms.api.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "web")["metadata"]["uid"]
    assert hv["cloudvm"] == {"namespace": k8s_namespace, "name": "web", "uid": uid, "owner": "bob-smith", "vcpus": 2,
                             "memory_mib": 4096, "node": "node-a", "boot_id": 1, "phase": "Running",
                             "reason": "SSHReady", "labels": {"course": "os"}}
    assert hv["memory_gib"] == 4 and run.hostvars(small)["memory_gib"] == 0
    assert run.group("big") == {web}
    assert run.group("course_os") == {web} and run.group("course_db") == {small}
    assert run.group("owner_bob_smith") == {web} and run.group("node_node_a") == {web, small}


def test_values_from_the_api_are_marked_unsafe_never_templated(k8s_cluster, vms, k8s_namespace, tmp_path):
    vms.start(k8s_namespace, "data", labels={"course": "os"})
    run = run_inventory(source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace]))
    raw = json.loads(run.stdout)["_meta"]["hostvars"][f"data.{k8s_namespace}"]
    assert raw["ansible_host"] == {UNSAFE: "192.0.2.10"}
    assert raw["cloudvm_owner"] == {UNSAFE: "alice"} and raw["cloudvm_labels"] == {"course": {UNSAFE: "os"}}


def test_cache_is_used_and_flush_cache_lists_again(k8s_cluster, vms, k8s_namespace, tmp_path):
    src = source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], cache=True,
                 cache_plugin="ansible.builtin.jsonfile", cache_connection=str(tmp_path / "cache"),
                 cache_timeout=3600)
    vms.start(k8s_namespace, "first")
    assert run_inventory(src).hosts() == names(["first"], k8s_namespace)
    vms.start(k8s_namespace, "second")
    assert run_inventory(src).hosts() == names(["first"], k8s_namespace), "second run must come from the cache"
    assert run_inventory(src, "--flush-cache").hosts() == names(["first", "second"], k8s_namespace)
    assert run_inventory(src).hosts() == names(["first", "second"], k8s_namespace), "the flush rewrote the cache"


def test_shipped_inventory_gives_a_restarted_vms_new_address(k8s_cluster, vms, k8s_namespace, tmp_path):
    """inventory/kubernetes.cloudvm.yml lists on every run: after a stop and start (a new boot, a new launcher Pod
    with a new IP) the next run gives the new address, never the one a cache kept (a newcomer's `ansible` timed
    out on the old address after vm_stop + vm_start with the cache the file used to turn on)."""
    shipped = REPO / "inventory" / "kubernetes.cloudvm.yml"
    home = tmp_path / "home"
    home.mkdir()
    env = ansible_env(K8S_AUTH_KUBECONFIG=str(k8s_cluster.kubeconfig), HOME=str(home), KUBECONFIG="/nonexistent")
    host = f"moved.{k8s_namespace}"
    vms.start(k8s_namespace, "moved")
    assert run_inventory(shipped, env=env).hostvars(host)["ansible_host"] == "192.0.2.10"
    vms.report(k8s_namespace, "moved", "Running", ip="192.0.2.77", node="node-b")  # boot 2's Pod elsewhere
    assert run_inventory(shipped, env=env).hostvars(host)["ansible_host"] == "192.0.2.77"
    assert not (home / ".cache" / "zjusct-cloud" / "inventory").exists(), "the shipped file caches nothing"


def test_shipped_inventory_cache_never_answers_for_another_identity(k8s_cluster, vms, k8s_namespace, tmp_path):
    """Issue case: inventory/kubernetes.cloudvm.yml with the cache its comment shows turned on (credentials from
    K8S_AUTH_*) run by the admin, then by the tenant: the tenant must get what --flush-cache gives her (a
    refusal), not the admin's VMs."""
    shipped = tmp_path / "kubernetes.cloudvm.yml"
    text = (REPO / "inventory" / "kubernetes.cloudvm.yml").read_text()
    assert "\ncache: false\n" in text and "#   cache_timeout: 300\n" in text
    shipped.write_text(text.replace("\ncache: false\n", "\n").replace("\n#   cache", "\ncache"))
    vms.start(k8s_namespace, "admins-vm", owner="bob")
    home = tmp_path / "home"  # the file's cache_connection is ~/.cache/zjusct-cloud/inventory
    home.mkdir()
    admin = ansible_env(K8S_AUTH_KUBECONFIG=str(k8s_cluster.kubeconfig), HOME=str(home), KUBECONFIG="/nonexistent")
    tenant = ansible_env(K8S_AUTH_KUBECONFIG=str(k8s_cluster.tenant_kubeconfig), HOME=str(home),
                         KUBECONFIG="/nonexistent")
    assert f"admins-vm.{k8s_namespace}" in run_inventory(shipped, env=admin).hosts()
    assert (home / ".cache" / "zjusct-cloud" / "inventory").is_dir(), "the admin's listing was cached"
    cached = run_inventory(shipped, env=tenant, check=False)
    flushed = run_inventory(shipped, "--flush-cache", env=tenant, check=False)
    for run in (cached, flushed):
        assert run.rc != 0 and "HTTP 403" in run.stderr, run.stdout[-2000:]
        assert f"admins-vm.{k8s_namespace}" not in run.stdout


def test_two_service_account_tokens_never_share_a_cache_entry(k8s_cluster, vms, k8s_api, k8s_namespace, tmp_path):
    """Two identities with different RBAC through K8S_AUTH_HOST/API_KEY, one cache directory."""
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    for sa in ("viewer", "outsider"):
        core.create_namespaced_service_account(k8s_namespace, {"metadata": {"name": sa}})
    rbac.create_namespaced_role_binding(k8s_namespace, {
        "metadata": {"name": "viewer-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": k8s_namespace}]})
    tokens = {sa: core.create_namespaced_service_account_token(
        sa, k8s_namespace, {"spec": {"expirationSeconds": 3600}}).status.token for sa in ("viewer", "outsider")}
    vms.start(k8s_namespace, "seen")
    cache = tmp_path / "cache"
    src = write_inventory(tmp_path / "sa.cloudvm.yml", namespaces=[k8s_namespace], cache=True,
                          cache_plugin="ansible.builtin.jsonfile", cache_connection=str(cache), cache_timeout=3600)
    ca = k8s_cluster.state_dir / "pki" / "ca.crt"
    env = {sa: ansible_env(K8S_AUTH_HOST=k8s_cluster.server, K8S_AUTH_API_KEY=token, K8S_AUTH_SSL_CA_CERT=str(ca),
                           K8S_AUTH_VERIFY_SSL="true", KUBECONFIG="/nonexistent") for sa, token in tokens.items()}

    from tests.cluster import wait_for

    def viewer_lists() -> set[str]:
        run = run_inventory(src, "--flush-cache", env=env["viewer"], check=False)
        return run.hosts() if run.rc == 0 else set()

    assert wait_for(viewer_lists, 60, "view role aggregated for the service account") == names(["seen"], k8s_namespace)
    outsider = run_inventory(src, env=env["outsider"], check=False)
    assert outsider.rc != 0 and "HTTP 403" in outsider.stderr, outsider.stdout[-2000:]
    assert 'serviceaccount:' in outsider.stderr and ":outsider" in outsider.stderr
    vms.start(k8s_namespace, "later")
    assert run_inventory(src, env=env["viewer"]).hosts() == names(["seen"], k8s_namespace), \
        "the viewer's own entry still answers for her"
    files = list(cache.iterdir())
    assert files
    for path in files:
        for token in tokens.values():
            assert token not in path.name and token not in path.read_text(), "a token must never reach the cache"


def test_case_A4_refresh_inventory_sees_a_vm_started_earlier_in_the_same_play(k8s_cluster, vms, k8s_namespace,
                                                                               tmp_path):
    src = source(tmp_path, k8s_cluster.kubeconfig, namespaces=[k8s_namespace], cache=True,
                 cache_plugin="ansible.builtin.jsonfile", cache_connection=str(tmp_path / "cache"),
                 cache_timeout=3600)
    vms.start(k8s_namespace, "old", owner="alice")
    assert run_inventory(src).hosts() == names(["old"], k8s_namespace)  # the cache now holds only "old"
    late = f"late.{k8s_namespace}"
    playbook = tmp_path / "a4.yml"
    playbook.write_text(yaml.safe_dump([
        {"name": "start a VM, refresh, find it", "hosts": "localhost", "gather_facts": False, "tasks": [
            {"name": "the VM is not in the (cached) inventory yet",
             "ansible.builtin.assert": {"that": [f"'{late}' not in groups['all']"]}},
            {"name": "start the VM (create the CloudVM; the helper reports Running as the controller would)",
             "ansible.builtin.command": {"argv": start_vm_command(k8s_cluster.kubeconfig, k8s_namespace, "late",
                                                                  "carol")}},
            {"ansible.builtin.meta": "refresh_inventory"},
            {"name": "the refreshed inventory has the VM",
             "ansible.builtin.assert": {"that": [f"'{late}' in groups['all']", f"'{late}' in groups['owner_carol']"]}},
        ]},
        {"name": "target the new VM's group", "hosts": "owner_carol", "gather_facts": False, "tasks": [
            {"ansible.builtin.debug": {"msg": "seen {{ inventory_hostname }} at {{ ansible_host }}"}},
        ]},
    ]))
    proc = run_playbook(playbook, src)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"seen {late} at 192.0.2.10" in proc.stdout
    # and the refresh rewrote the cache: a later cached run sees the VM too
    assert run_inventory(src).hosts() == names(["old", "late"], k8s_namespace)


def test_tenant_sees_only_her_namespace(k8s_cluster, vms, k8s_namespace, tmp_path):
    vms.start(k8s_namespace, "elsewhere", owner="bob")
    vms.start(TENANT_NAMESPACE, "alice-vm", owner="alice")
    try:
        run = run_inventory(source(tmp_path, k8s_cluster.tenant_kubeconfig, namespaces=[TENANT_NAMESPACE]))
        assert run.hosts() == {f"alice-vm.{TENANT_NAMESPACE}"}
        assert run.group("owner_alice") == {f"alice-vm.{TENANT_NAMESPACE}"}
        # all namespaces needs cluster-wide list rights she does not have: a clear refusal, not a traceback
        wide = run_inventory(source(tmp_path, k8s_cluster.tenant_kubeconfig), check=False)
        assert wide.rc != 0
        assert "HTTP 403" in wide.stderr and 'User "alice" cannot list resource "cloudvms"' in wide.stderr
        assert "set namespaces to the ones you may read" in wide.stderr
        assert "Traceback" not in wide.stderr
        other = run_inventory(source(tmp_path, k8s_cluster.tenant_kubeconfig, namespaces=[k8s_namespace]),
                              check=False)
        assert other.rc != 0 and "HTTP 403" in other.stderr
    finally:
        with contextlib.suppress(ApiException):
            vms.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, "alice-vm")


def test_token_credentials_from_k8s_auth_environment(k8s_cluster, vms, k8s_api, k8s_namespace, tmp_path):
    """AWX's Kubernetes credential injects K8S_AUTH_HOST/API_KEY/SSL_CA_CERT: the plugin must use them."""
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(k8s_namespace, {"metadata": {"name": "awx"}})
    rbac.create_namespaced_role_binding(k8s_namespace, {
        "metadata": {"name": "awx-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "awx", "namespace": k8s_namespace}]})
    token = core.create_namespaced_service_account_token(
        "awx", k8s_namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    vms.start(k8s_namespace, "awx-target")
    ca = k8s_cluster.state_dir / "pki" / "ca.crt"
    src = write_inventory(tmp_path / "awx.cloudvm.yml", namespaces=[k8s_namespace])
    env = ansible_env(K8S_AUTH_HOST=k8s_cluster.server, K8S_AUTH_API_KEY=token, K8S_AUTH_SSL_CA_CERT=str(ca),
                      K8S_AUTH_VERIFY_SSL="true", KUBECONFIG="/nonexistent")

    def listed() -> set[str]:
        return run_inventory(src, env=env).hosts()

    from tests.cluster import wait_for

    assert wait_for(listed, 60, "view role aggregated for the service account") == {f"awx-target.{k8s_namespace}"}
    verbose = run_inventory(src, "-vvvv", env=env)
    assert token not in verbose.stdout + verbose.stderr, "case A3: the token must never be printed"


def test_exec_credential_plugin_goes_through_the_kubernetes_client(k8s_cluster, vms, k8s_namespace, tmp_path):
    """A kubeconfig user with an exec plugin (as cloud providers' kubeconfigs have) still works."""
    admin = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    user = admin["users"][0]["user"]
    base = Path(k8s_cluster.kubeconfig).parent

    def pem(key: str) -> str:
        import base64

        if user.get(key + "-data"):
            return base64.b64decode(user[key + "-data"]).decode()
        path = Path(user[key])
        return (path if path.is_absolute() else base / path).read_text()

    cred = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
            "status": {"clientCertificateData": pem("client-certificate"), "clientKeyData": pem("client-key")}}
    cred_file = tmp_path / "cred.json"
    cred_file.write_text(json.dumps(cred))
    admin["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "cat",
                                          "args": [str(cred_file)], "interactiveMode": "Never"}}
    for cluster in admin["clusters"]:
        ca = cluster["cluster"].get("certificate-authority")
        if ca and not Path(ca).is_absolute():
            cluster["cluster"]["certificate-authority"] = str(base / ca)
    exec_kubeconfig = tmp_path / "exec.kubeconfig"
    exec_kubeconfig.write_text(yaml.safe_dump(admin))
    vms.start(k8s_namespace, "via-exec")
    run = run_inventory(source(tmp_path, exec_kubeconfig, namespaces=[k8s_namespace]), "-vvv")
    assert run.hosts() == {f"via-exec.{k8s_namespace}"}
    assert "using the kubernetes client (the kubeconfig user uses an exec credential plugin)" in run.stdout + run.stderr
