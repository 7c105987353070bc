"""The AWX definitions in awx/ against their sources: surveys vs the module spec and the CRD, the credential type
vs what the modules and the inventory plugin read, the inventory sources vs inventory/, awx_configure vs awx/."""

from __future__ import annotations

import importlib.util
import re
import stat
from pathlib import Path

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.backend import BACKENDS
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import cloudvm_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.model import spec as _spec

from tests.awx_runner import (
    check_answers,
    credential_type,
    inject_credential,
    job_template,
    launch_extra_vars,
    load,
)

REPO = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((REPO / "config/crd/cloudvms.cloud.zjusct.io.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
BW_SCHEMA = SPEC_SCHEMA["network"]["properties"]["bandwidth"]["properties"]
PLAYBOOKS = ["site.yml", "playbooks/vm_start.yml", "playbooks/vm_stop.yml", "playbooks/vm_restart.yml",
             "playbooks/vm_delete.yml", "playbooks/vm_backup.yml", "playbooks/vm_restore.yml"]


def _generator():
    spec = importlib.util.spec_from_file_location("awx_generate", REPO / "awx/generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def questions(playbook: str) -> dict[str, dict]:
    return {q["variable"]: q for q in job_template(playbook)["survey_spec"]["spec"]}


def test_committed_job_templates_are_the_generated_ones():
    assert (REPO / "awx/job_templates.yml").read_text() == _generator().render(), \
        "awx/job_templates.yml is out of date: run python3 awx/generate.py"


def test_one_job_template_per_playbook():
    assert [jt["playbook"] for jt in load("job_templates.yml")["awx_job_templates"]] == PLAYBOOKS
    for playbook in PLAYBOOKS:
        assert (REPO / playbook).is_file()


@pytest.mark.parametrize(("variable", "schema", "low", "high"), [
    ("vcpus", SPEC_SCHEMA["vcpus"], _spec.VCPUS_MIN, _spec.VCPUS_MAX),
    ("memory_mib", SPEC_SCHEMA["memoryMiB"], _spec.MEMORY_MIB_MIN, _spec.MEMORY_MIB_MAX),
    ("guaranteed_mbps", BW_SCHEMA["guaranteedMbps"], 0, _spec.BANDWIDTH_MBPS_MAX),
    ("ceil_mbps", BW_SCHEMA["ceilMbps"], 1, _spec.BANDWIDTH_MBPS_MAX),
    ("bandwidth_priority", BW_SCHEMA["priority"], _spec.PRIORITY_MIN, _spec.PRIORITY_MAX),
])
def test_integer_survey_limits_equal_the_module_spec_and_the_crd(variable, schema, low, high):
    q = questions("playbooks/vm_start.yml")[variable]
    assert q["type"] == "integer"
    assert (q["min"], q["max"]) == (low, high) == (schema["minimum"], schema["maximum"])
    # empty answer = option omitted: the module keeps an existing VM's value or applies the API default
    assert q["required"] is False and q["default"] == ""


def test_integer_questions_are_int_options_of_the_module():
    argspec = cloudvm_argument_spec()
    assert argspec["vcpus"]["type"] == argspec["memory_mib"]["type"] == "int"
    bw = argspec["bandwidth"]["options"]
    assert bw["guaranteed_mbps"]["type"] == bw["ceil_mbps"]["type"] == bw["priority"]["type"] == "int"


def test_text_survey_limits_equal_the_crd():
    start = questions("playbooks/vm_start.yml")
    key_schema = SPEC_SCHEMA["sshAuthorizedKeys"]["items"]
    assert start["ssh_public_key"]["max"] == key_schema["maxLength"] == _spec.SSH_KEY_LEN_MAX
    for playbook in PLAYBOOKS[1:]:
        name = questions(playbook)["name"]
        assert name["type"] == "text" and name["max"] == 63 and name["required"] is False
        # the same rule as model.spec.is_dns_label: 63 characters fit, 64 do not
        assert _spec.is_dns_label("a" * name["max"]) and not _spec.is_dns_label("a" * (name["max"] + 1))
    assert SPEC_SCHEMA["owner"]["maxLength"] == 63


def test_backup_id_question_fits_the_backup_id_rule():
    from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import _ID_RE

    q = questions("playbooks/vm_restore.yml")["backup"]
    example = "20261130T064323Z-a904c0"
    assert _ID_RE.match(example) and q["min"] == q["max"] == len(example) and q["required"] is True


def test_site_backend_choices_are_the_module_backends():
    q = questions("site.yml")["zjusct_cloud_backend"]
    assert q["choices"] == list(BACKENDS) == cloudvm_argument_spec()["backend"]["choices"]
    assert q["default"] == "host"


def test_owner_is_never_asked_and_variables_are_never_prompted():
    forbidden = {"owner", "operator", "allow_owner_change", "awx_user_name", "backup_dir", "zjusct_cloud_hosts",
                 "vm_namespace", "ssh_public_key_file"}
    for jt in load("job_templates.yml")["awx_job_templates"]:
        asked = {q["variable"] for q in jt["survey_spec"]["spec"]}
        assert not asked & forbidden, (jt["name"], asked & forbidden)
        assert jt["ask_variables_on_launch"] is False and jt["survey_enabled"] is True


def test_every_survey_variable_is_read_by_its_playbook():
    for playbook in PLAYBOOKS:
        text = (REPO / playbook).read_text()
        if playbook == "site.yml":
            text += "".join(p.read_text() for p in (REPO / "roles").rglob("*.yml"))
        for variable in questions(playbook):
            assert re.search(rf"\b{variable}\b", text), f"{playbook} does not read {variable}"


def test_boolean_questions_are_what_the_bool_filter_reads():
    for playbook in PLAYBOOKS:
        for q in questions(playbook).values():
            if q["choices"] == ["false", "true"]:
                assert q["default"] in q["choices"] and q["required"] is True
                assert re.search(rf"{q['variable']} \| default\((true|false)\) \| bool", (REPO / playbook).read_text())


def test_launch_checks_answers_like_awx():
    jt = job_template("playbooks/vm_start.yml")
    with pytest.raises(ValueError, match="vcpus: 5 is outside 1 to 4"):
        check_answers(jt["survey_spec"], {"vcpus": _spec.VCPUS_MAX + 1})
    with pytest.raises(KeyError, match="owner: not a survey question"):
        check_answers(jt["survey_spec"], {"owner": "bob"})
    got = launch_extra_vars(jt, {"vcpus": 2}, "alice")
    assert got["vcpus"] == 2 and got["awx_user_name"] == got["tower_user_name"] == "alice"
    assert "name" not in got and "memory_mib" not in got  # optional, empty default: left out
    assert launch_extra_vars(job_template("playbooks/vm_delete.yml"), {}, "alice")["delete_volume"] == "false"


# --------------------------------------------------------------------------- credential type

def _read_by_code() -> set[str]:
    """Environment variables the collection's modules, module_utils and inventory plugin read."""
    names: set[str] = set()
    for path in list((REPO / "plugins").rglob("*.py")):
        text = path.read_text()
        names.update(re.findall(r"""(?:environ\.get|getenv|env_fallback, \[)\(?["']([A-Z0-9_]+)["']""", text))
        names.update(re.findall(r"- name: ([A-Z0-9_]+)", text))  # DOCUMENTATION env: entries (inventory)
        names.update(re.findall(r"""^[A-Z_]*_ENV = ["']([A-Z0-9_]+)["']""", text, re.M))  # e.g. backend.BACKEND_ENV
    return names


def test_injected_variables_are_those_the_code_reads():
    ctype = credential_type()
    env = set(ctype["injectors"]["env"])
    read = _read_by_code()
    # kubernetes.core reads K8S_AUTH_<OPTION> for each connection option (k8s/client.py _create_auth_spec)
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_MAP

    read |= {f"K8S_AUTH_{name.upper()}" for pair in AUTH_ARG_MAP.items() for name in pair}
    assert env <= read, f"injected but read by nothing: {sorted(env - read)}"
    for needed in ("ZJUSCT_CLOUD_CONFIG", "ZJUSCT_CLOUD_BACKEND", "ZJUSCT_CLOUD_INVENTORY_SOURCE", "K8S_AUTH_HOST",
                   "K8S_AUTH_API_KEY", "K8S_AUTH_SSL_CA_CERT", "CEPH_USER", "CEPH_KEYRING"):
        assert needed in env
    assert not ctype["injectors"].get("extra_vars"), "secrets go to env and files, never to extra vars (job events)"


def test_every_input_is_injected_and_secrets_are_marked():
    ctype = credential_type()
    templates = " ".join(list(ctype["injectors"]["env"].values()) + list(ctype["injectors"]["file"].values()))
    fields = {f["id"]: f for f in ctype["inputs"]["fields"]}
    for fid in fields:
        assert re.search(rf"\b{fid}\b", templates), f"input {fid} is injected nowhere"
    assert fields["k8s_api_key"]["secret"] and fields["ceph_keyring"]["secret"]
    assert fields["backend"]["choices"] == list(BACKENDS)


def test_injectors_render_as_awx_renders_them(tmp_path: Path):
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    keyring = "[client.backup]\n\tkey = AQBsecretsecret==\n"
    got = inject_credential(credential_type(), {
        "backend": "kubernetes", "host_config": "/etc/zjusct-cloud/host.json", "k8s_host": "https://192.0.2.10:6443",
        "k8s_api_key": "tok-secret", "k8s_ca_cert": ca, "ceph_user": "backup", "ceph_keyring": keyring}, tmp_path)
    env = got.env
    assert env["ZJUSCT_CLOUD_BACKEND"] == env["ZJUSCT_CLOUD_INVENTORY_SOURCE"] == "kubernetes"
    assert env["K8S_AUTH_HOST"] == "https://192.0.2.10:6443" and env["K8S_AUTH_API_KEY"] == "tok-secret"
    assert env["K8S_AUTH_VERIFY_SSL"] == "true" and env["CEPH_USER"] == "backup"
    assert Path(env["K8S_AUTH_SSL_CA_CERT"]).read_text() == ca
    assert Path(env["CEPH_KEYRING"]).read_text() == keyring
    for path in got.files.values():
        assert path.parent == tmp_path / "env" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(got.secrets) == sorted(["tok-secret", keyring])


def test_empty_inputs_render_empty_and_the_modules_ignore_them(tmp_path: Path):
    env = inject_credential(credential_type(), {"backend": "host", "host_config": "/srv/host.json"}, tmp_path).env
    assert env["ZJUSCT_CLOUD_CONFIG"] == "/srv/host.json" and env["ZJUSCT_CLOUD_BACKEND"] == "host"
    assert env["K8S_AUTH_SSL_CA_CERT"] == env["CEPH_KEYRING"] == env["K8S_AUTH_API_KEY"] == ""


# --------------------------------------------------------------------------- inventory sources, configure

def test_inventory_sources_are_the_cloudvm_inventory_files():
    sources = load("inventory_sources.yml")["awx_inventory_sources"]
    assert {s["source_path"] for s in sources} == {
        str(p.relative_to(REPO)) for p in (REPO / "inventory").glob("*cloudvm.yml")}
    for s in sources:
        assert yaml.safe_load((REPO / s["source_path"]).read_text())["plugin"] == "zjusct.cloud.cloudvm"


def test_awx_configure_loads_the_generated_definitions():
    text = (REPO / "playbooks/awx_configure.yml").read_text()
    tasks = yaml.safe_load(text)[0]["tasks"]
    load_task = next(t for t in tasks if "ansible.builtin.include_vars" in t)
    assert "/../awx/{{ item }}" in load_task["ansible.builtin.include_vars"]["file"]
    assert load_task["loop"] == ["job_templates.yml", "credential_type.yml", "inventory_sources.yml"]
    for module in ("credential_type", "credential", "project", "inventory", "inventory_source", "job_template",
                   "execution_environment"):
        assert f"awx.awx.{module}:" in text


def test_definitions_reach_the_awx_modules_untemplated(tmp_path: Path):
    """What awx_configure.yml hands the awx.awx modules: its own include_vars of awx/, templated into module
    arguments as the playbook does; the injectors must stay Jinja2 for AWX (!unsafe), the surveys as generated."""
    import json
    import os
    import subprocess
    import sys

    configure = yaml.safe_load((REPO / "playbooks/awx_configure.yml").read_text())[0]
    load_task = next(t for t in configure["tasks"] if "ansible.builtin.include_vars" in t)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {**load_task, "ansible.builtin.include_vars": {"file": f"{REPO}/awx/{{{{ item }}}}"}},
        {"name": "Arguments", "ansible.builtin.debug": {"msg": {
            "injectors": "{{ awx_credential_type.injectors }}", "surveys": "{{ awx_job_templates }}"}}},
    ]}]
    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(path)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=True)
    msg = json.loads(proc.stdout)["plays"][0]["tasks"][1]["hosts"]["localhost"]["msg"]
    assert msg["injectors"] == credential_type()["injectors"]
    assert msg["injectors"]["env"]["K8S_AUTH_HOST"] == "{{ k8s_host }}"
    assert msg["surveys"] == load("job_templates.yml")["awx_job_templates"]
