# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate awx/job_templates.yml: the AWX job templates and their surveys (docs/awx.md).

Every survey limit (min, max, default, choices) comes from the collection's own sources, never typed here:
the CloudVM field limits of ``plugins/module_utils/model/spec.py`` (the CRD in ``config/crd/`` carries the same
numbers; tests/unit/awx/test_awx_definitions.py checks all three agree) and the backends of
``plugins/module_utils/backend.py`` and the power states of ``plugins/module_utils/cloudvm_module.py``.

    python3 awx/generate.py           # rewrite awx/job_templates.yml
    python3 awx/generate.py --check   # exit 1 when the committed file differs from what would be generated

Survey question fields are those of AWX's survey_spec (question_name, question_description, variable, type,
required, min, max, default, choices). For ``text``/``textarea`` questions min and max are lengths in characters.
``owner`` is never a question: the playbooks take the launching user (``awx_user_name``) instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "awx" / "job_templates.yml"
DNS_LABEL_MAX = 63
BACKUP_ID_LEN = len("20261130T064323Z-a904c0")  # storage.backup_chain._ID_RE: YYYYmmddTHHMMSSZ-xxxxxx


def _spec_module() -> Any:
    collections = REPO / ".collections"
    if str(collections) not in sys.path:
        sys.path.insert(0, str(collections))
    from ansible_collections.zjusct.cloud.plugins.module_utils.model import spec as _spec

    return _spec


def _question(variable: str, name: str, description: str, qtype: str, *, required: bool = False,
              minimum: int | None = None, maximum: int | None = None, default: Any = "",
              choices: list[str] | None = None) -> dict[str, Any]:
    q: dict[str, Any] = {"question_name": name, "question_description": description, "variable": variable,
                         "type": qtype, "required": required, "default": default}
    if minimum is not None:
        q["min"] = minimum
    if maximum is not None:
        q["max"] = maximum
    q["choices"] = choices if choices is not None else ""
    return q


def _bool_question(variable: str, name: str, description: str, default: bool) -> dict[str, Any]:
    # The playbooks read these with the bool filter, so the strings "true"/"false" are what they expect.
    return _question(variable, name, description, "multiplechoice", required=True,
                     default="true" if default else "false", choices=["false", "true"])


def surveys() -> dict[str, list[dict[str, Any]]]:
    """The survey questions of each playbook (key: playbook path), in the order AWX shows them."""
    s = _spec_module()
    name_q = _question("name", "VM name", f"Leave empty for a VM named after you. {s.DNS_LABEL_RULE}.", "text",
                       minimum=0, maximum=DNS_LABEL_MAX)
    start = [
        name_q,
        _question("vcpus", "vCPUs", f"Virtual CPUs (spec.vcpus), {s.VCPUS_MIN} to {s.VCPUS_MAX}; empty: "
                  f"{s.DEFAULTS['vcpus']} for a new VM, unchanged for an existing one.", "integer",
                  minimum=s.VCPUS_MIN, maximum=s.VCPUS_MAX),
        _question("memory_mib", "Memory (MiB)", f"Guest memory in MiB (spec.memoryMiB), {s.MEMORY_MIB_MIN} to "
                  f"{s.MEMORY_MIB_MAX}; empty: {s.DEFAULTS['memoryMiB']} for a new VM, unchanged for an existing "
                  "one.", "integer", minimum=s.MEMORY_MIB_MIN, maximum=s.MEMORY_MIB_MAX),
        _question("ssh_public_key", "SSH public key", "One OpenSSH public key line (ssh-ed25519 AAAA...), "
                  "authorised for root in the guest.", "textarea", minimum=0, maximum=s.SSH_KEY_LEN_MAX),
        _question("guaranteed_mbps", "Guaranteed bandwidth (Mbit/s)", "Bandwidth reserved for the VM "
                  f"(spec.network.bandwidth.guaranteedMbps), 0 to {s.BANDWIDTH_MBPS_MAX}; empty: unshaped.",
                  "integer", minimum=0, maximum=s.BANDWIDTH_MBPS_MAX),
        _question("ceil_mbps", "Bandwidth ceiling (Mbit/s)", "Most the VM may borrow "
                  f"(spec.network.bandwidth.ceilMbps), at least the guarantee, at most {s.BANDWIDTH_MBPS_MAX}; "
                  "empty: the guarantee. Used only with a guarantee.", "integer",
                  minimum=1, maximum=s.BANDWIDTH_MBPS_MAX),
        _question("bandwidth_priority", "Borrowing priority", "Order in which spare bandwidth is lent "
                  f"(spec.network.bandwidth.priority), {s.PRIORITY_MIN} to {s.PRIORITY_MAX}, 0 first. "
                  "Used only with a guarantee.", "integer",
                  minimum=s.PRIORITY_MIN, maximum=s.PRIORITY_MAX),
    ]
    start.append(_question("volume_size_mib", "Root disk size (MiB)", "Grow the VM's root volume to this many MiB "
                           f"(spec.rootVolumeSizeMiB), up to {s.ROOT_VOLUME_SIZE_MIB_MAX}; a root volume only grows; "
                           "empty: the image's size for a new VM, unchanged for an existing one. The disk and its "
                           "file system grow at the next boot.", "integer", minimum=s.ROOT_VOLUME_SIZE_MIB_MIN,
                           maximum=s.ROOT_VOLUME_SIZE_MIB_MAX))
    for key, (option, (low, high), unit) in s.DISK_IO.items():
        what = f"Disk {'read' if key.startswith('read') else 'write'} limit ({unit})"
        start.append(_question(f"disk_{option}", what, f"Most {unit} the VM's root disk serves "
                               f"(spec.diskIO.{key}), {low} to {high}; 0 removes the VM's own limit (the "
                               "operator's still applies); empty: unchanged. Takes effect at the next boot.",
                               "integer", minimum=0, maximum=high))
    start.append(_question("anti_affinity_group", "Anti-affinity group", "Your running VMs of the same group never "
                           f"share a node (spec.antiAffinityGroup); {s.DNS_LABEL_RULE}; none removes it; empty: "
                           "unchanged. Takes effect at the next boot.", "text", minimum=0, maximum=DNS_LABEL_MAX))
    return {
        "site.yml": [
            _question("zjusct_cloud_backend", "Backend", "host: the hypervisor role only; kubernetes: also the "
                      "CloudVM API on the cluster.", "multiplechoice", required=True, default="host",
                      choices=list(_backends())),
        ],
        "playbooks/vm_start.yml": start,
        "playbooks/vm_stop.yml": [name_q],
        "playbooks/vm_restart.yml": [name_q],
        "playbooks/vm_delete.yml": [
            name_q,
            _bool_question("delete_volume", "Also delete the root volume", "false keeps the disk: starting a VM "
                           "of the same name later boots it again with its data.", False),
        ],
        "playbooks/vm_backup.yml": [
            name_q,
            _bool_question("stop_if_running", "Stop the VM first", "Backups are offline: true stops a running "
                           "VM (it stays stopped), false refuses a running VM.", False),
            _bool_question("full", "Full backup", "false: incremental since the previous backup when possible.",
                           False),
        ],
        "playbooks/vm_restore.yml": [
            _question("backup", "Backup id", "The id vm_backup printed, e.g. 20261130T064323Z-a904c0.", "text",
                      required=True, minimum=BACKUP_ID_LEN, maximum=BACKUP_ID_LEN),
            _question("name", "New VM name", f"Leave empty for <you>-restored. {s.DNS_LABEL_RULE}.", "text",
                      minimum=0, maximum=DNS_LABEL_MAX),
            _bool_question("start", "Start the restored VM", "false creates it Stopped.", True),
        ],
    }


def _backends() -> tuple[str, ...]:
    # backend imports Ansible's kubernetes.core when present; BACKENDS is a plain tuple there.
    _spec_module()
    from ansible_collections.zjusct.cloud.plugins.module_utils.backend import BACKENDS

    return tuple(BACKENDS)


TEMPLATES = [
    # (template name, playbook, audience, description)
    ("zjusct.cloud site", "site.yml", "operator",
     "Bring the inventory's hypervisors up (and the CloudVM API with backend kubernetes)."),
    ("zjusct.cloud VM start", "playbooks/vm_start.yml", "tenant",
     "Create (if missing) and start your VM; ends when its SSH answers."),
    ("zjusct.cloud VM stop", "playbooks/vm_stop.yml", "tenant", "Shut your VM down (forced after the stop timeout)."),
    ("zjusct.cloud VM restart", "playbooks/vm_restart.yml", "tenant", "Stop and start your VM (bootID + 1)."),
    ("zjusct.cloud VM delete", "playbooks/vm_delete.yml", "tenant",
     "Delete your VM; its root volume is kept unless you ask otherwise."),
    ("zjusct.cloud VM backup", "playbooks/vm_backup.yml", "tenant",
     "Offline backup of your VM's root volume, whatever its driver (full or incremental, verified)."),
    ("zjusct.cloud VM restore", "playbooks/vm_restore.yml", "tenant",
     "Restore one of your backups into a new VM and start it."),
]


def job_templates() -> list[dict[str, Any]]:
    """Every job template: name, playbook, audience, description and its AWX survey_spec."""
    questions = surveys()
    out = []
    for name, playbook, audience, description in TEMPLATES:
        out.append({
            "name": name,
            "playbook": playbook,
            "audience": audience,
            "description": description,
            # Never prompt for variables on launch: a tenant could pass operator=true or owner (docs/security.md).
            "ask_variables_on_launch": False,
            "survey_enabled": True,
            "survey_spec": {"name": name, "description": description, "spec": questions[playbook]},
        })
    return out


def render() -> str:
    """The text of awx/job_templates.yml."""
    import json

    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
            return super().increase_indent(flow, False)  # yamllint's indent-sequences style

    header = ("---\n# GENERATED by awx/generate.py from plugins/module_utils/model/spec.py; do not edit by hand.\n"
              "# Loaded by playbooks/awx_configure.yml (docs/awx.md).\n")
    data = json.loads(json.dumps({"awx_job_templates": job_templates()}))
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False,
                     allow_unicode=True)
    return header + body


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} is out of date: run python3 awx/generate.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
