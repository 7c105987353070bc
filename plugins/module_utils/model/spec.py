# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CloudVM spec: field limits, validation and update rules shared by every backend.

The same rules are enforced by the CRD's OpenAPI schema and CEL rules on Kubernetes
(config/crd/); this module is their twin for the host backend and for early, precise errors in the
modules. Messages name the field path, the value and the allowed range, e.g.
``spec.memoryMiB: 8192 is above the maximum 4096``; :func:`in_user_terms` puts in front of each API
field path the option / playbook variable a user typed and the field's rule, e.g.
``memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): 8192 is above the maximum 4096``.

Sources: DNS label / subdomain syntax from the Kubernetes object-names doc
(https://kubernetes.io/docs/concepts/overview/working-with-objects/names/), OpenSSH public key
formats from sshd(8) "AUTHORIZED_KEYS FILE FORMAT".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# The CloudVM API (config/crd/cloudvms.cloud.zjusct.io.yaml): defined here only; the Kubernetes client, the
# inventory plugin, the controller and the tests import these.
GROUP = "cloud.zjusct.io"
VERSION = "v1alpha1"
PLURAL = "cloudvms"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CloudVM"
# The ownership marks (docs/security.md, "Ownership marks"), written only by the trusted control plane (the
# modules and the controller): the owner id, a label on Kubernetes objects (PersistentVolumes, claims) and RBD
# image-meta; and the uid of the CloudVM that uses a root volume, an annotation on the claim and RBD image-meta.
OWNER_MARK = f"{GROUP}/owner"
CLAIMED_BY_MARK = f"{GROUP}/claimed-by"
# The finalizer the controller puts on a launcher Pod with an RBD root disk: the Pod stays the record of its RBD
# client until its launcher is known to have ended or was fenced (docs/controller.md, Fencing).
FENCE_FINALIZER = f"{GROUP}/fence"

VCPUS_MIN, VCPUS_MAX = 1, 4
MEMORY_MIB_MIN, MEMORY_MIB_MAX = 128, 4096
# spec.rootVolumeSizeMiB: 1 MiB to 16 TiB (the launcher's rootDisk.sizeMiB range)
ROOT_VOLUME_SIZE_MIB_MIN, ROOT_VOLUME_SIZE_MIB_MAX = 1, 16777216
BANDWIDTH_MBPS_MAX = 100000
PRIORITY_MIN, PRIORITY_MAX = 0, 1000
SSH_KEYS_MAX = 16
# spec.diskIO (model/disk_io.py combines a VM's limits with the operator's): API key -> (the cloudvm module's disk_io
# suboption; the playbook variable is disk_<suboption>), (minimum, maximum), unit. Below the minimums a root disk
# cannot boot a guest within a readiness timeout (a Debian boot reads ~60 MiB in a few thousand requests); above
# the maximums a limit limits nothing a virtio disk does.
DISK_IO_BYTES_PER_SECOND = (1048576, 1099511627776)  # 1 MiB/s .. 1 TiB/s
DISK_IO_REQUESTS_PER_SECOND = (20, 10000000)
DISK_IO = {
    "readBytesPerSecond": ("read_bytes_per_second", DISK_IO_BYTES_PER_SECOND, "bytes/s"),
    "writeBytesPerSecond": ("write_bytes_per_second", DISK_IO_BYTES_PER_SECOND, "bytes/s"),
    "readIOPS": ("read_iops", DISK_IO_REQUESTS_PER_SECOND, "requests/s"),
    "writeIOPS": ("write_iops", DISK_IO_REQUESTS_PER_SECOND, "requests/s"),
}
SSH_KEY_LEN_MAX = 8192
POWER_STATES = ("Running", "Stopped")
# status.phase values (docs/api/cloudvm.md; model.phase.derive_status)
PHASES = ("Pending", "Running", "Stopping", "Stopped", "Failed", "Blocked", "Unknown")

DEFAULTS = {"vcpus": 1, "memoryMiB": 512, "powerState": "Stopped", "bootID": 0}

DNS_LABEL_RULE = ("RFC 1123 DNS label: lower-case letters, digits and '-', at most 63 characters,"
                  " start and end with a letter or digit")
DNS_SUBDOMAIN_RULE = ("RFC 1123 DNS subdomain: DNS labels joined by '.', at most 253 characters")

# API field path -> (what the user typed: playbook variable, then the module option where it differs; the rule).
# The playbook variables are those of playbooks/vm_*.yml (docs/playbooks.md); the module options those of
# zjusct.cloud.cloudvm. Used by in_user_terms().
FIELDS = {
    "metadata.name": ("name", DNS_LABEL_RULE),
    "metadata.namespace": ("vm_namespace / namespace", DNS_LABEL_RULE),
    "spec.owner": ("owner", DNS_LABEL_RULE),
    "spec.rootVolumeClaim": ("root_volume_claim", f"default <name>-root; {DNS_SUBDOMAIN_RULE}"),
    "spec.vcpus": ("vcpus", f"allowed {VCPUS_MIN} to {VCPUS_MAX}"),
    "spec.memoryMiB": ("memory_mib", f"allowed {MEMORY_MIB_MIN} to {MEMORY_MIB_MAX} MiB"),
    "spec.rootVolumeSizeMiB": ("volume_size_mib", f"allowed {ROOT_VOLUME_SIZE_MIB_MIN} to "
                               f"{ROOT_VOLUME_SIZE_MIB_MAX} MiB; a root volume only grows"),
    "spec.powerState": ("power_state", "running or stopped"),
    "spec.sshAuthorizedKeys": ("ssh_public_key / ssh_authorized_keys",
                               f"OpenSSH public key lines, at most {SSH_KEYS_MAX}"),
    "spec.network.bandwidth.guaranteedMbps": ("guaranteed_mbps / bandwidth.guaranteed_mbps",
                                              f"allowed 0 to {BANDWIDTH_MBPS_MAX} Mbit/s"),
    "spec.network.bandwidth.ceilMbps": ("ceil_mbps / bandwidth.ceil_mbps",
                                        f"allowed guaranteed_mbps to {BANDWIDTH_MBPS_MAX} Mbit/s"),
    "spec.network.bandwidth.pool": ("bandwidth_pool / bandwidth.pool", DNS_LABEL_RULE),
    "spec.network.bandwidth.priority": ("bandwidth_priority / bandwidth.priority",
                                        f"allowed {PRIORITY_MIN} to {PRIORITY_MAX}"),
    "spec.antiAffinityGroup": ("anti_affinity_group", f"{DNS_LABEL_RULE}; empty removes it"),
}
FIELDS.update({f"spec.diskIO.{key}": (f"disk_{option} / disk_io.{option}", f"allowed {low} to {high} {unit}")
               for key, (option, (low, high), unit) in DISK_IO.items()})
_FIELD_REF = re.compile(r"(?<![\w.\[(])((?:spec|metadata)\.[A-Za-z.]*[A-Za-z])(\[\d+\])?:")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|"
    r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) AAAA[A-Za-z0-9+/]+={0,3}( [^\r\n]*)?$"
)


def default_root_volume_claim(vm_name: str) -> str:
    """The root volume claim the cloudvm module gives a new CloudVM when its ``root_volume_claim`` option is unset:
    ``<name>-root`` (docs/playbooks.md)."""
    return f"{vm_name}-root"


def vm_option_claim(vm: object) -> tuple[str, str | None]:
    """The ``vm`` option of ``root_volume_info`` and ``root_volume_claim``: ``(its default root volume claim,
    the refusal)``, the refusal None when ``vm`` is a DNS label (:func:`dns_label_problem`)."""
    return default_root_volume_claim(str(vm)), dns_label_problem("vm", vm, "a CloudVM name such as web")


def is_dns_label(value: object) -> bool:
    """True when ``value`` is an RFC 1123 DNS label (lower case, 1-63 characters)."""
    return isinstance(value, str) and bool(_DNS_LABEL.match(value))


def dns_label_problem(what: str, value: object, note: str = "") -> str | None:
    """The one refusal of a name that must be an RFC 1123 DNS label (:func:`is_dns_label`), or None when it is one.

    Args:
        what: the option as the user typed it (``owner``, ``target_volume``, ``vm``), or an API field path of
            :data:`FIELDS` (``spec.owner``, ``metadata.name``) in a message :func:`in_user_terms` later rewrites.
        value: the value given (any type: a non-string is no label).
        note: optional context appended after ``; `` (what the name is used for, what to give instead).

    Returns:
        None for a DNS label, else ``<what>: <value!r> is not a DNS label (<DNS_LABEL_RULE>)[; <note>]``; for an
        API field path of :data:`FIELDS` without the ``(<rule>)``, which :func:`in_user_terms` puts after the path.
    """
    if is_dns_label(value):
        return None
    rule = "" if what in FIELDS else f" ({DNS_LABEL_RULE})"
    return f"{what}: {value!r} is not a DNS label{rule}" + (f"; {note}" if note else "")


def is_dns_subdomain(value: object) -> bool:
    """True when ``value`` is an RFC 1123 DNS subdomain (at most 253 characters)."""
    return isinstance(value, str) and len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


def is_ssh_public_key(value: object) -> bool:
    """True when ``value`` is one OpenSSH public key line (type, base64 blob, optional comment)."""
    return isinstance(value, str) and len(value) <= SSH_KEY_LEN_MAX and bool(_SSH_KEY.match(value.strip()))


def in_user_terms(message: str) -> str:
    """Rewrite each ``<API field path>:`` in ``message`` to name what the user typed and the rule.

    ``spec.memoryMiB: 4097 is above the maximum 4096`` becomes
    ``memory_mib (spec.memoryMiB; allowed 128 to 4096 MiB): 4097 is above the maximum 4096``. Works on
    this module's messages and on the Kubernetes API's (``spec.vcpus: Invalid value: 0: ...``); paths not
    in :data:`FIELDS` and text already rewritten are left as they are.
    """
    def label(match: "re.Match[str]") -> str:
        path, index = match.group(1), match.group(2) or ""
        if path not in FIELDS:
            return match.group(0)
        typed, rule = FIELDS[path]
        return f"{typed}{index} ({path}{index}; {rule}):"

    return _FIELD_REF.sub(label, message)


def _int_in_range(errors: list[str], path: str, value: object, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{path}: {value!r} is not an integer")
    elif value < low:
        errors.append(f"{path}: {value} is below the minimum {low}")
    elif high is not None and value > high:
        errors.append(f"{path}: {value} is above the maximum {high}")


def with_defaults(spec: dict) -> dict:
    """Return a copy of ``spec`` with the API defaults filled in (vcpus 1, memoryMiB 512, ...)."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in spec.items() if v is not None})
    return out


def validate_spec(spec: dict) -> list[str]:
    """Check a CloudVM spec (after defaults) against the API's rules.

    Args:
        spec: the ``spec`` mapping with camelCase keys as in the CRD.

    Returns:
        Every problem found, one message per field (empty when the spec is valid).
    """
    errors: list[str] = []
    owner = spec.get("owner")
    if owner is None:
        errors.append("spec.owner: required (a DNS label such as 'alice')")
    else:
        errors.extend(filter(None, [dns_label_problem("spec.owner", owner)]))
    claim = spec.get("rootVolumeClaim")
    if claim is None:
        errors.append("spec.rootVolumeClaim: required (a DNS subdomain such as 'alice-root')")
    elif not is_dns_subdomain(claim):
        errors.append(f"spec.rootVolumeClaim: {claim!r} is not a DNS subdomain")
    _int_in_range(errors, "spec.vcpus", spec.get("vcpus"), VCPUS_MIN, VCPUS_MAX)
    _int_in_range(errors, "spec.memoryMiB", spec.get("memoryMiB"), MEMORY_MIB_MIN, MEMORY_MIB_MAX)
    if spec.get("rootVolumeSizeMiB") is not None:
        _int_in_range(errors, "spec.rootVolumeSizeMiB", spec["rootVolumeSizeMiB"], ROOT_VOLUME_SIZE_MIB_MIN,
                      ROOT_VOLUME_SIZE_MIB_MAX)
    _int_in_range(errors, "spec.bootID", spec.get("bootID"), 0, None)
    power = spec.get("powerState")
    if power not in POWER_STATES:
        errors.append(f"spec.powerState: {power!r} is not one of {', '.join(POWER_STATES)}")
    keys = spec.get("sshAuthorizedKeys") or []
    if not isinstance(keys, list):
        errors.append("spec.sshAuthorizedKeys: must be a list of OpenSSH public keys")
    else:
        if len(keys) > SSH_KEYS_MAX:
            errors.append(f"spec.sshAuthorizedKeys: {len(keys)} keys is above the maximum {SSH_KEYS_MAX}")
        for i, key in enumerate(keys):
            if not is_ssh_public_key(key):
                shown = key if isinstance(key, str) and len(key) < 40 else f"{str(key)[:37]}..."
                errors.append(f"spec.sshAuthorizedKeys[{i}]: {shown!r} is not an OpenSSH public key")
    bandwidth = (spec.get("network") or {}).get("bandwidth")
    if bandwidth:
        errors.extend(_validate_bandwidth(bandwidth))
    if spec.get("diskIO") is not None:
        errors.extend(validate_disk_io(spec["diskIO"], "spec.diskIO"))
    group = spec.get("antiAffinityGroup")
    if group is not None:
        errors.extend(filter(None, [dns_label_problem("spec.antiAffinityGroup", group)]))
    return errors


def validate_disk_io(limits: object, path: str) -> list[str]:
    """Check a mapping of disk I/O limits (:data:`DISK_IO` keys): ``spec.diskIO`` or an operator's limits.

    Args:
        limits: the mapping (any value: a non-mapping is a problem).
        path: the field path messages start with, e.g. ``spec.diskIO`` or ``disk_io_limits``.

    Returns:
        One message per problem (an unknown key, a value that is not an integer or out of its range), each
        starting ``<path>.<key>:``; empty when valid.
    """
    if not isinstance(limits, Mapping):
        return [f"{path}: must be a mapping of {', '.join(DISK_IO)}"]
    errors = [f"{path}.{key}: unknown field (allowed: {', '.join(DISK_IO)})" for key in limits if key not in DISK_IO]
    for key, (_option, (low, high), _unit) in DISK_IO.items():
        if limits.get(key) is not None:
            _int_in_range(errors, f"{path}.{key}", limits[key], low, high)
    return errors


def _validate_bandwidth(bw: dict) -> list[str]:
    errors: list[str] = []
    path = "spec.network.bandwidth"
    guaranteed = bw.get("guaranteedMbps", 0)
    _int_in_range(errors, f"{path}.guaranteedMbps", guaranteed, 0, BANDWIDTH_MBPS_MAX)
    ceil = bw.get("ceilMbps")
    if ceil is not None:
        _int_in_range(errors, f"{path}.ceilMbps", ceil, 1, BANDWIDTH_MBPS_MAX)
    if isinstance(guaranteed, int) and isinstance(ceil, int) and not isinstance(ceil, bool) and ceil < guaranteed:
        errors.append(f"{path}.ceilMbps: {ceil} is below guaranteedMbps {guaranteed}")
    pool = bw.get("pool")
    if pool is not None:
        errors.extend(filter(None, [dns_label_problem(f"{path}.pool", pool)]))
    _int_in_range(errors, f"{path}.priority", bw.get("priority", 0), PRIORITY_MIN, PRIORITY_MAX)
    return errors


def validate_update(old: dict, new: dict) -> list[str]:
    """Check the transition rules of an update (the CRD's CEL transition rules).

    ``owner`` and ``rootVolumeClaim`` are immutable; ``bootID`` never decreases; ``rootVolumeSizeMiB``, once set,
    never decreases nor goes (a root volume only grows: the CRD's ``self >= oldSelf`` and its ``oldSelf`` rule on
    spec).

    Returns:
        One message per violated rule (empty when the update is allowed).
    """
    errors = []
    for field in ("owner", "rootVolumeClaim"):
        if old.get(field) != new.get(field):
            errors.append(f"spec.{field}: is immutable (was {old.get(field)!r}, requested {new.get(field)!r})")
    if int(new.get("bootID", 0)) < int(old.get("bootID", 0)):
        errors.append(f"spec.bootID: must never decrease (was {old.get('bootID')}, requested {new.get('bootID')})")
    size, was = new.get("rootVolumeSizeMiB"), old.get("rootVolumeSizeMiB")
    if was is not None and (size is None or int(size) < int(was)):
        errors.append(f"spec.rootVolumeSizeMiB: must never decrease (was {was}, requested {size}); a root volume "
                      "only grows")
    return errors
