"""The inventory's pure decisions: records from CloudVM dicts, filtering, host names, hostvars, groups."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.plugin_utils._inventory import (
    InventoryOptionError,
    InventoryOptions,
    group_name,
    host_entries,
    parse_label_selector,
    select,
    vm_record,
)


def cloudvm(name: str, namespace: str = "default", owner: str = "alice", phase: str | None = "Running",
            labels: dict | None = None, node: str | None = "node-1", proxy: str | None = None,
            endpoint: dict | None = None) -> dict:
    status: dict[str, Any] = {}
    if phase is not None:
        status = {"phase": phase, "reason": "SSHReady" if phase == "Running" else "Stopped", "bootID": 3,
                  "node": node, "sshEndpoint": endpoint or {"host": "10.200.0.7", "port": 22}}
        if proxy:
            status["sshProxyCommand"] = proxy
    return {
        "apiVersion": "cloud.zjusct.io/v1alpha1", "kind": "CloudVM",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}",
                     "labels": labels or {}},
        "spec": {"owner": owner, "vcpus": 2, "memoryMiB": 1024, "bootID": 4, "rootVolumeClaim": f"{name}-root"},
        "status": status,
    }


def opts(**overrides: Any) -> InventoryOptions:
    defaults = {"source": "kubernetes", "include_phases": ["Running"], "group_by": ["owner", "namespace", "node"],
                "use_proxy_command": True}
    defaults.update(overrides)
    return InventoryOptions.from_options(defaults.get)


def hosts(vms: list[dict], **overrides: Any) -> dict:
    o = opts(**overrides)
    entries, _ = host_entries(select([vm_record(v) for v in vms], o), o)
    return {e.name: e for e in entries}


def test_running_vm_becomes_host_with_ssh_endpoint_and_prefixed_vars():
    (entry,) = hosts([cloudvm("web", "tenant-alice")]).values()
    assert entry.name == "web.tenant-alice"
    hv = entry.hostvars
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("10.200.0.7", 22, "root")
    assert "ansible_ssh_common_args" not in hv
    assert hv["cloudvm_owner"] == "alice" and hv["cloudvm_vcpus"] == 2 and hv["cloudvm_memory_mib"] == 1024
    assert hv["cloudvm_node"] == "node-1" and hv["cloudvm_phase"] == "Running"
    assert hv["cloudvm_boot_id"] == 3, "boot_id is the boot the status describes, not the requested one"
    assert entry.groups == ("owner_alice", "namespace_tenant_alice", "node_node_1")


def test_only_running_vms_are_listed_by_default():
    vms = [cloudvm("a"), cloudvm("b", phase="Stopped"), cloudvm("c", phase="Pending"), cloudvm("d", phase=None)]
    assert sorted(hosts(vms)) == ["a.default"]
    assert sorted(hosts(vms, include_phases=["Running", "Pending"])) == ["a.default", "c.default"]
    assert sorted(hosts(vms, include_all=True)) == ["a.default", "b.default", "c.default", "d.default"]


def test_vm_without_status_yet_has_no_connection_address():
    entry = hosts([cloudvm("fresh", phase=None)], include_all=True)["fresh.default"]
    assert "ansible_host" not in entry.hostvars and entry.hostvars["cloudvm_phase"] == ""
    assert entry.hostvars["cloudvm_boot_id"] == 4  # falls back to spec.bootID
    assert entry.groups == ("owner_alice", "namespace_default")  # no node yet: no node group


def test_proxy_command_from_status_becomes_shell_quoted_ssh_common_args():
    import shlex

    proxy = "ip netns exec zjusct-cloud nc %h %p"
    hv = hosts([cloudvm("a", proxy=proxy)])["a.default"].hostvars
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", f"ProxyCommand={proxy}"]
    assert "ansible_ssh_common_args" not in hosts([cloudvm("a", proxy=proxy)], use_proxy_command=False)[
        "a.default"].hostvars


def test_jump_host_uses_the_vm_node_and_proxy_command_wins_over_it():
    import shlex

    hv = hosts([cloudvm("a", node="node-2")], jump_host="ops@{node}")["a.default"].hostvars
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", "ProxyJump=ops@node-2"]
    hv = hosts([cloudvm("a", proxy="nc %h %p")], jump_host="ops@{node}")["a.default"].hostvars
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", "ProxyCommand=nc %h %p"]


def test_filters_by_namespace_owner_and_label_selector():
    vms = [cloudvm("a", "ns1", "alice", labels={"course": "os", "tier": "web"}),
           cloudvm("b", "ns2", "bob", labels={"course": "db"}),
           cloudvm("c", "ns1", "carol", labels={"tier": "db"})]
    assert sorted(hosts(vms, namespaces=["ns1"])) == ["a.ns1", "c.ns1"]
    assert sorted(hosts(vms, owners=["bob", "carol"])) == ["b.ns2", "c.ns1"]
    assert sorted(hosts(vms, label_selector="course")) == ["a.ns1", "b.ns2"]
    assert sorted(hosts(vms, label_selector="course in (os, db),tier!=web")) == ["b.ns2"]
    assert sorted(hosts(vms, label_selector="!course")) == ["c.ns1"]
    assert sorted(hosts(vms, label_selector="tier notin (web)")) == ["b.ns2", "c.ns1"]


def test_group_names_are_valid_variable_names():
    assert group_name("owner", "bob-smith") == "owner_bob_smith"
    assert group_name("node", "rack1.node-3") == "node_rack1_node_3"


def test_group_by_choice_and_phase_groups():
    entry = hosts([cloudvm("a")], group_by=["phase", "owner"])["a.default"]
    assert entry.groups == ("phase_Running", "owner_alice")
    assert hosts([cloudvm("a")], group_by=[])["a.default"].groups == ()


def test_default_hostname_cannot_collide_but_dash_format_can_and_warns():
    vms = [cloudvm("c", "a-b"), cloudvm("b-c", "a")]
    assert sorted(hosts(vms)) == ["b-c.a", "c.a-b"]
    o = opts(hostname_format="{namespace}-{name}")
    entries, warnings = host_entries(select([vm_record(v) for v in vms], o), o)
    assert [e.name for e in entries] == ["a-b-c"]
    assert len(warnings) == 1 and "a-b/c" in warnings[0] and "a/b-c" in warnings[0]


def test_hostvar_prefix_applies_to_plugin_vars_only():
    hv = hosts([cloudvm("a")], hostvar_prefix="vm_")["a.default"].hostvars
    assert hv["vm_owner"] == "alice" and "ansible_host" in hv and "cloudvm_owner" not in hv
    hv = hosts([cloudvm("a")], hostvar_prefix="")["a.default"].hostvars
    assert hv["owner"] == "alice"


FIELDS = ("namespace", "name", "uid", "owner", "vcpus", "memory_mib", "node", "boot_id", "phase", "reason", "labels")


def test_nested_layout_sets_one_dict_with_the_flat_layouts_fields_and_the_same_connection_vars():
    vm = cloudvm("web", "tenant-alice", labels={"course": "os"}, proxy="ip netns exec zjusct-cloud nc %h %p")
    flat = hosts([vm])["web.tenant-alice"]
    nested = hosts([vm], hostvars_layout="nested")["web.tenant-alice"]
    connection = ("ansible_user", "ansible_host", "ansible_port", "ansible_ssh_common_args")
    assert set(nested.hostvars) == {*connection, "cloudvm"}
    assert {k: nested.hostvars[k] for k in connection} == {k: flat.hostvars[k] for k in connection}
    assert nested.hostvars["cloudvm"] == {field: flat.hostvars["cloudvm_" + field] for field in FIELDS}
    assert nested.hostvars["cloudvm"]["labels"] == {"course": "os"} and nested.hostvars["cloudvm"]["vcpus"] == 2
    assert nested.groups == flat.groups
    assert set(flat.hostvars) == {*connection, *("cloudvm_" + f for f in FIELDS)}, "flat (the default) unchanged"


def test_nested_layout_names_its_variable_after_the_prefix_and_refuses_an_empty_one():
    hv = hosts([cloudvm("a")], hostvars_layout="nested", hostvar_prefix="vm_")["a.default"].hostvars
    assert hv["vm"]["owner"] == "alice" and "vm_owner" not in hv and "cloudvm" not in hv
    for prefix in ("", "_"):
        with pytest.raises(InventoryOptionError) as err:
            opts(hostvars_layout="nested", hostvar_prefix=prefix)
        assert f"hostvar_prefix {prefix!r} leaves no name" in str(err.value)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("source", "aws", "source: 'aws' is not one of kubernetes, host"),
    ("include_phases", ["Runing"], "include_phases: 'Runing' is not a phase"),
    ("group_by", ["rack"], "group_by: 'rack' is not one of owner, namespace, node, phase"),
    ("hostname_format", "{name}.{zone}", "hostname_format: '{name}.{zone}' uses {zone}"),
    ("hostname_format", "{name", "hostname_format: '{name' is not a valid format string"),
    ("jump_host", "{0}", "jump_host: '{0}' uses {0}"),
    ("hostvar_prefix", "9x-", "hostvar_prefix: '9x-' must start with a letter"),
    ("label_selector", "a=b,,c", "label_selector: 'a=b,,c' has an empty requirement"),
    ("label_selector", "bad key=x", "invalid label key 'bad key'"),
    ("hostvars_layout", "tree", "hostvars_layout: 'tree' is not one of flat, nested"),
])
def test_bad_options_name_the_option_the_value_and_what_is_allowed(option, value, message):
    with pytest.raises(InventoryOptionError, match=None) as err:
        opts(**{option: value})
    assert message in str(err.value)


def test_label_selector_parser_follows_kubernetes_semantics():
    (req,) = parse_label_selector("env!=prod")
    assert req.matches({}) and req.matches({"env": "dev"}) and not req.matches({"env": "prod"})
    (req,) = parse_label_selector("env==prod")
    assert req.matches({"env": "prod"}) and not req.matches({})
    reqs = parse_label_selector("cloud.zjusct.io/course in (os,net), !legacy")
    assert [r.op for r in reqs] == ["in", "!"]
    assert reqs[0].values == frozenset({"os", "net"})


def test_record_is_small_and_json_serialisable():
    import json

    rec = vm_record(cloudvm("a", proxy="nc %h %p"))
    assert json.loads(json.dumps(rec)) == rec
    assert set(rec) == {"namespace", "name", "uid", "labels", "owner", "vcpus", "memory_mib", "boot_id", "phase",
                        "reason", "node", "ssh_host", "ssh_port", "ssh_proxy_command", "ssh_jump_host"}


def test_ssh_gateway_jump_host_is_used_only_when_asked_and_then_wins():
    """Outside the host (use_ssh_gateway) the status' sshJumpHost is the ProxyJump; inside, the proxy command stays."""
    import shlex

    vm = cloudvm("a", proxy="ip netns exec zjusct-cloud nc %h %p")
    vm["status"]["sshJumpHost"] = "zc-alice@gw.example.org:2222"
    inside = hosts([vm])["a.default"].hostvars
    assert shlex.split(inside["ansible_ssh_common_args"]) == ["-o", "ProxyCommand=ip netns exec zjusct-cloud nc %h %p"]
    outside = hosts([vm], use_ssh_gateway=True)["a.default"].hostvars
    assert shlex.split(outside["ansible_ssh_common_args"]) == ["-o", "ProxyJump=zc-alice@gw.example.org:2222"]
    assert (outside["ansible_host"], outside["ansible_port"]) == ("10.200.0.7", 22)
    no_gateway = hosts([cloudvm("b", proxy="nc %h %p")], use_ssh_gateway=True)["b.default"].hostvars
    assert shlex.split(no_gateway["ansible_ssh_common_args"]) == ["-o", "ProxyCommand=nc %h %p"]
