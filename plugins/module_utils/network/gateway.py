# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SSH gateway of the single-host backend: tenants reach their own VMs' SSH ports, and only those.

Design (docs/security.md, "Tenants reach their own VMs: the SSH gateway"):

* A second sshd (OpenSSH from Debian) with its own config, host key and port (``gateway_port``, 2222 by
  default), running in the namespace of the uplink's outer side (``uplink_netns``, the host's by default).
  From there the guests' subnet is routed through the uplink veth; the cloud's namespace lets NEW TCP to a
  guest's port 22 in from the outer uplink address only (:func:`network.hostnet.guard_ruleset`), and the outer
  namespace lets only root and the gateway group open such connections (:func:`network.hostnet.uplink_outer_ruleset`).
* One system account per owner (:func:`account_name`, ``zc-<owner>``), primary group
  :data:`GROUP`, no password, created with ``useradd`` argv. Its login shell is ``<gateway_dir>/shell``
  (:func:`shell_script`): the launcher's console client (``zjusct-launcher gateway``), never a command shell.
* The accounts' keys are ``<gateway_dir>/keys/<account>`` (root:GROUP, 0640), written by the cloud from the
  VMs' keys and leases: one line per distinct public key of the owner's VMs, ``restrict,pty,port-forwarding``,
  one ``permitopen="<ip>:22"`` per VM of that owner whose keys list it, and the forced ``command`` naming the
  serial console sockets of those same VMs (:func:`authorized_keys`): ``ssh -t <account>@<gateway> console
  <vm>`` attaches to one of them (docs/tenants.md, "Serial console"), and nothing else runs.
  A VM's keys are those of the boot its guest runs, else its spec's (:func:`keys_in_effect`): a change of
  ``spec.sshAuthorizedKeys`` takes effect at the next boot, on the gateway as in the guest.
  They are rewritten atomically (temporary file + rename) under a host flock whenever a VM gets its
  address, starts a boot, changes its keys or is deleted (:func:`sync_keys`), so a deleted VM's address is
  gone before a later VM can lease it again.
* sshd reads ``keys/<account>`` as that account (OpenSSH ``user_key_allowed2``: ``temporarily_use_uid`` takes
  the user's uid, primary group and groups before ``auth_openkeyfile``, and with ``StrictModes`` every directory
  from the file up to ``/`` must be owned by root (or the user) and not group or world writable). So every
  directory above ``gateway_dir`` must let the group :data:`GROUP` pass (search permission) and be root-owned
  and not group/world writable: :func:`path_problems` decides it and :func:`ensure_gateway` refuses a path
  that fails, naming the directory, instead of installing a gateway that refuses every tenant.

Pure functions (:func:`account_name`, :func:`key_identity`, :func:`keys_in_effect`, :func:`key_grants`,
:func:`authorized_keys`, :func:`sshd_config`, :func:`path_problems`) decide; the rest write files and run
``useradd``/``groupadd``/``ssh-keygen`` with argument lists.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import subprocess
import tempfile
from typing import Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import is_ssh_public_key

ACCOUNT_PREFIX = "zc-"
# useradd(8): user names are at most 32 characters (Debian's shadow; UT_NAMESIZE of utmp)
ACCOUNT_NAME_MAX = 32
GROUP = "zjusct-gateway"
SHELL = "shell"
"""The accounts' login shell in the gateway's directory (:func:`shell_script`)."""
HOME = "/"
"""The accounts' home: sshd changes into it before the shell runs (none of their own; a missing one is a warning on
the tenant's console)."""
GUEST_SSH_PORT = 22
HOST_KEY = "ssh_host_ed25519_key"


class GatewayError(CloudError):
    """A gateway step failed; the message names the step, the path or command and the error."""


def account_name(owner: str) -> str:
    """The gateway account of ``owner`` (a DNS label): ``zc-<owner>``, hashed to 32 characters if longer
    (:func:`model.names.fit`). ``alice`` -> ``zc-alice``."""
    return _names.fit(ACCOUNT_PREFIX + owner, ACCOUNT_NAME_MAX)


def key_identity(line: str) -> Optional[str]:
    """``"<type> <base64>"`` of an OpenSSH public key line (comment dropped), None if it is not one
    (:func:`model.spec.is_ssh_public_key`: no options, no line breaks)."""
    if not is_ssh_public_key(line):
        return None
    kind, blob = line.strip().split()[:2]
    return f"{kind} {blob}"


def keys_in_effect(spec_keys: Optional[list], boot_keys: Optional[list]) -> list:
    """The keys the gateway grants for one VM: those its guest has.

    The rule (docs/security.md, "Tenants reach their own VMs"; docs/api/cloudvm.md, ``sshAuthorizedKeys`` is
    "mutable, next boot"): the guest installs the keys of its boot's config disk at boot and keeps them until
    that boot ends, so a running boot's keys are the ones that log in; while no boot runs, the spec's keys are
    the ones its next boot will get.

    Args:
        spec_keys: ``spec.sshAuthorizedKeys`` (None = none).
        boot_keys: ``identity.sshAuthorizedKeys`` of the LauncherConfig of the boot that runs (or is starting),
            None when no boot runs.

    Returns:
        A new list of OpenSSH public key lines.
    """
    return list(boot_keys if boot_keys is not None else spec_keys or [])


def key_grants(vms: Iterable[dict]) -> dict:
    """Which key may open which guest, and which console, per owner.

    Args:
        vms: ``{"owner": str, "ipv4": str, "keys": [OpenSSH public key lines], "console": [label, socket path]}``
            for each VM holding an address lease (a stopped VM keeps its lease and its address stays its own);
            ``label`` is ``<namespace>/<name>``; ``console`` may be absent (no console).

    Returns:
        account name -> {key identity -> {"ipv4": sorted addresses, "consoles": {label: socket path}}}: a key
        opens exactly the VMs of its owner whose keys list it, and their consoles. Lines that are not public
        keys are left out.
    """
    grants: dict = {}
    for vm in vms:
        per_key = grants.setdefault(account_name(vm["owner"]), {})
        for line in vm.get("keys") or []:
            ident = key_identity(line)
            if ident is not None:
                grant = per_key.setdefault(ident, {"ipv4": set(), "consoles": {}})
                grant["ipv4"].add(str(vm["ipv4"]))
                if vm.get("console"):
                    label, path = vm["console"]
                    grant["consoles"][label] = path
    return {account: {k: {"ipv4": sorted(g["ipv4"]), "consoles": dict(sorted(g["consoles"].items()))}
                      for k, g in keys.items()} for account, keys in grants.items()}


def authorized_keys(per_key: dict) -> str:
    """The authorized_keys file of one gateway account.

    Args:
        per_key: key identity -> ``{"ipv4", "consoles"}`` (one account's part of :func:`key_grants`).

    Returns:
        One line per key, sorted: ``restrict,pty,port-forwarding,permitopen="<ip>:22",...,command="<ns>/<name>=
        <socket> ..." <type> <base64>``; "" when there is no key. ``restrict`` turns off PTYs, agent and X11
        forwarding, remote forwarding and ~/.ssh/rc; ``port-forwarding`` re-allows local forwarding, limited by
        sshd to the ``permitopen`` list; ``pty`` re-allows a terminal for the console. The forced ``command`` is
        what sshd hands the account's shell (``zjusct-launcher gateway``) whatever the client asks to run: the
        consoles this key may attach to (socket paths have only letters, digits and ``_ . / -``, so nothing in
        it needs quoting).
    """
    lines = []
    for ident in sorted(per_key):
        grant = per_key[ident]
        opens = ",".join(f'permitopen="{ip}:{GUEST_SSH_PORT}"' for ip in grant["ipv4"])
        consoles = " ".join(f"{label}={path}" for label, path in grant["consoles"].items())
        if opens:
            lines.append(f'restrict,pty,port-forwarding,{opens},command="{consoles}" {ident}')
    return "".join(line + "\n" for line in lines)


def shell_script(launcher_command: Iterable[str], pythonpath: str) -> str:
    """``<gateway_dir>/shell``, the gateway accounts' login shell: runs ``<launcher_command> gateway "$@"``.

    sshd runs a session as ``<shell> -c <command>``, the command being the key's forced one; the launcher's
    ``gateway`` (``zjusct_launcher.console.gateway_main``) reads it as the consoles granted and the client's
    ``SSH_ORIGINAL_COMMAND`` as the choice, and runs nothing else (no ``sh -c`` anywhere).

    Args:
        launcher_command: the argv prefix that runs the launcher (host config ``launcher_command``).
        pythonpath: ``PYTHONPATH`` for it (host config ``launcher_pythonpath``; "" for none).
    """
    prefix = f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""
    argv = " ".join(shlex.quote(a) for a in launcher_command)
    return ("#!/bin/sh\n# zjusct.cloud SSH gateway accounts' shell (written by zjusct.cloud.host_network;"
            " docs/security.md)\n" f'{prefix}exec {argv} gateway "$@"\n')


def sshd_config(directory: str, port: int) -> str:
    """The gateway sshd's configuration (``<directory>/sshd_config``).

    Only members of :data:`GROUP` may log in, by public key only, keys read only from
    ``<directory>/keys/%u``; no command shell (the accounts' shell is :func:`shell_script`, each key's
    ``command`` forced), no agent, X11, remote or Unix-socket forwarding, no tunnels; local TCP forwarding to
    port 22 only (``PermitOpen *:22``, narrowed per key to the owner's VMs by ``permitopen`` in the keys file);
    a terminal only for the console (``PermitTTY``, re-allowed per key by ``pty``).
    """
    return "\n".join([
        "# zjusct.cloud SSH gateway (written by zjusct.cloud.host_network; docs/security.md)",
        f"Port {int(port)}",
        f"HostKey {os.path.join(directory, HOST_KEY)}",
        "PidFile none",
        f"AuthorizedKeysFile {os.path.join(directory, 'keys', '%u')}",
        "AuthorizedKeysCommand none",
        "AuthorizedPrincipalsFile none",
        f"AllowGroups {GROUP}",
        "PermitRootLogin no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitEmptyPasswords no",
        "UsePAM no",
        "StrictModes yes",
        "PermitTTY yes",
        "PermitUserRC no",
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "AllowAgentForwarding no",
        "AllowStreamLocalForwarding no",
        "AllowTcpForwarding local",
        "GatewayPorts no",
        "PermitListen none",
        "PermitTunnel no",
        f"PermitOpen *:{GUEST_SSH_PORT}",
        "PrintMotd no",
        "Banner none",
        "ClientAliveInterval 60",
        "LogLevel VERBOSE",
        "",
    ])


def path_problems(ancestors: Iterable[tuple], gid: Optional[int]) -> list:
    """Why sshd, as a gateway account, could not read its keys file below these directories ([] = it can).

    Args:
        ancestors: ``(path, uid, gid, mode)`` of each existing directory above the gateway's directory, from
            ``/`` down (``mode`` the permission bits, e.g. ``0o700``).
        gid: the gid of :data:`GROUP` (the accounts' primary group), None if it does not exist yet (then only
            the "other" bits count).

    Returns:
        One message per directory that fails, naming it, its owner:group and mode and what is wrong: not
        searchable by the accounts (no ``x`` for others, nor for the group when it is :data:`GROUP`), or what
        sshd's ``StrictModes`` refuses (not owned by root; group or world writable).
    """
    problems = []
    for path, uid, dir_gid, mode in ancestors:
        wrong = []
        if not (mode & 0o001 or (gid is not None and dir_gid == gid and mode & 0o010)):
            wrong.append(f"the gateway's accounts (group {GROUP}) cannot pass through it")
        if uid != 0:
            wrong.append("sshd's StrictModes wants it owned by root")
        if mode & 0o022:
            wrong.append("sshd's StrictModes refuses a group or world writable directory")
        if wrong:
            problems.append(f"{path} (uid {uid}, gid {dir_gid}, mode {mode:04o}): " + " and ".join(wrong))
    return problems


# --- effects --------------------------------------------------------------------------------------
def _run(argv: list) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GatewayError(f"{' '.join(argv)}: {exc}") from exc
    if proc.returncode != 0:
        raise GatewayError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def existing_group_id() -> Optional[int]:
    """The gid of :data:`GROUP`, None when it does not exist."""
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return None


def group_id() -> int:
    """The gid of :data:`GROUP`, created with ``groupadd --system`` when missing. Raises GatewayError."""
    gid = existing_group_id()
    if gid is not None:
        return gid
    _run(["groupadd", "--system", GROUP])
    return grp.getgrnam(GROUP).gr_gid


def ensure_account(name: str, shell: str) -> bool:
    """Create the system account ``name`` (group :data:`GROUP`, login shell ``shell``, home ``/``, no password).

    The password field is ``*`` (no password matches it) rather than useradd's ``!``: sshd without PAM
    refuses every login, public key included, to an account whose password is locked with ``!``. An
    existing account of that name is used only if its primary group is :data:`GROUP`; otherwise
    :class:`GatewayError` (the name belongs to someone else). An existing account with another shell or home (the
    ``/usr/sbin/nologin`` and ``/nonexistent`` of gateways before the serial console) gets ``shell`` and ``/``.

    Returns:
        whether the account was created, unlocked or given its shell.
    """
    gid = group_id()
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--system", "--gid", GROUP, "--no-create-home", "--home-dir", HOME,
              "--shell", shell, "--comment", "zjusct.cloud SSH gateway", "--password", "*", name])
        return True
    if entry.pw_gid != gid:
        raise GatewayError(f"account {name}: exists with primary group {entry.pw_gid}, not {GROUP} ({gid});"
                           " it is not a gateway account, so it is not taken over")
    changed = False
    if (entry.pw_shell, entry.pw_dir) != (shell, HOME):
        _run(["usermod", "--shell", shell, "--home", HOME, name])
        changed = True
    shadow = _run(["getent", "shadow", name]).stdout.split(":")
    if len(shadow) > 1 and shadow[1].startswith("!"):
        _run(["usermod", "--password", "*", name])
        changed = True
    return changed


def _write_atomic(path: str, content: str, mode: int, gid: int = 0) -> bool:
    """Write ``content`` to ``path`` (root:gid, ``mode``) through a temporary file and rename; False if same."""
    try:
        with open(path, encoding="utf-8") as fh:
            st = os.fstat(fh.fileno())
            if fh.read() == content and st.st_gid == gid and st.st_mode & 0o777 == mode:
                return False
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchown(fh.fileno(), 0, gid)
            os.fchmod(fh.fileno(), mode)
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def _ensure_dir(path: str, mode: int, gid: int = 0) -> bool:
    changed = False
    if not os.path.isdir(path):
        os.makedirs(path, mode=mode)
        changed = True
    st = os.stat(path)
    if (st.st_uid, st.st_gid) != (0, gid):
        os.chown(path, 0, gid)
        changed = True
    if st.st_mode & 0o777 != mode:
        os.chmod(path, mode)
        changed = True
    return changed


def _ancestors(directory: str) -> tuple[list, list]:
    """``(path, uid, gid, mode)`` of each existing directory above ``directory`` (from ``/`` down), and the
    missing ones (from the top down)."""
    parts = os.path.normpath(directory).split(os.sep)[1:-1]
    found: list = []
    missing: list = []
    for depth in range(len(parts) + 1):
        path = os.sep + os.sep.join(parts[:depth])
        try:
            st = None if missing else os.stat(path)
        except FileNotFoundError:
            st = None
        if st is None:
            missing.append(path)
        else:
            found.append((path, st.st_uid, st.st_gid, st.st_mode & 0o7777))
    return found, missing


def check_path(directory: str, gid: Optional[int]) -> list:
    """:func:`path_problems` of the directories above ``directory`` as they are now (missing ones are created
    root 0755 by :func:`ensure_gateway`, which passes)."""
    return path_problems(_ancestors(directory)[0], gid)


def ensure_gateway(directory: str, port: int, shell: str, check_mode: bool = False) -> bool:
    """Install the gateway's files: ``<directory>`` (0755, and any missing directory above it root 0755), its
    host key, ``sshd_config`` (0644), the accounts' shell ``<directory>/shell`` (``shell``, the text of
    :func:`shell_script`; 0755) and the keys directory (root:GROUP 0750); create :data:`GROUP`. Starting sshd is
    the role's (or the test's).

    The directories above ``<directory>`` must let sshd read the keys as each account (:func:`path_problems`);
    the hypervisor role makes its config directory (the default ``gateway_dir``'s parent) root:GROUP 0710 for
    this. A path that fails is refused before anything is written.

    Returns:
        whether anything changed (in check mode: would change; a path that fails counts as a change, since the
        role's own tasks before this one may fix it).

    Raises:
        GatewayError: a directory above ``<directory>`` fails :func:`path_problems` (each one named, with the
            host config key and the role variable), or ssh-keygen or groupadd failed.
    """
    config = sshd_config(directory, port)
    keys_dir = os.path.join(directory, "keys")
    host_key = os.path.join(directory, HOST_KEY)
    if check_mode:
        same = not _differs(os.path.join(directory, "sshd_config"), config) \
            and not _differs(os.path.join(directory, SHELL), shell)
        return not (same and os.path.isdir(keys_dir) and os.path.exists(host_key) and existing_group_id() is not None
                    and not check_path(directory, existing_group_id()))
    gid = group_id()
    problems = check_path(directory, gid)
    if problems:
        raise GatewayError(
            f"gateway_dir (hypervisor_ssh_gateway_dir): {directory}: sshd reads each tenant's keys file"
            f" {keys_dir}/zc-<owner> as that account (group {GROUP}), so every directory above it must be"
            " searchable by that group, owned by root and not group or world writable (sshd's StrictModes); "
            + "; ".join(problems) + f". Make it root:{GROUP} 0710 (or 0711), or choose another"
            " hypervisor_ssh_gateway_dir; none of the gateway's files was written")
    changed = False
    for missing in _ancestors(directory)[1]:  # root 0755 whatever the umask is (it passes path_problems)
        changed |= _ensure_dir(missing, 0o755)
    changed |= _ensure_dir(directory, 0o755)
    changed |= _ensure_dir(keys_dir, 0o750, gid)
    if not os.path.exists(host_key):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "zjusct-cloud-gateway", "-f", host_key])
        changed = True
    changed |= _write_atomic(os.path.join(directory, "sshd_config"), config, 0o644)
    changed |= _write_atomic(os.path.join(directory, SHELL), shell, 0o755)
    return changed


def launcher_problems(pythonpath: str) -> list:
    """Why the gateway's accounts could not run the launcher's console client from ``pythonpath`` ([] = they can):
    every directory from ``/`` down to it must be passable by others (``x``), and it readable (``r``).

    Args:
        pythonpath: the host config's ``launcher_pythonpath`` ("" = the interpreter's own path: nothing to check).

    Returns:
        One message per directory that fails, naming it and its mode.
    """
    if not pythonpath:
        return []
    problems = []
    parts = os.path.normpath(pythonpath).split(os.sep)[1:]
    for depth in range(len(parts) + 1):
        path = os.sep + os.sep.join(parts[:depth])
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            problems.append(f"{path} does not exist")
            break
        wanted = 0o005 if depth == len(parts) else 0o001
        if mode & wanted != wanted:
            problems.append(f"{path} (mode {mode:04o}) is not {'readable and ' if wanted == 0o005 else ''}passable"
                            " by others")
    return problems


def known_hosts_line(directory: str, host: str, port: int) -> Optional[str]:
    """The ``known_hosts`` line (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT) that lets a client check the gateway's host key
    at ``host``: ``[host]:port ssh-ed25519 <key>`` (plain ``host`` on port 22), the key's comment left out; None
    while the host key does not exist yet. Tenants add it to ~/.ssh/known_hosts: the jump connection of
    ``ssh -J`` (and of the inventory's ProxyJump) checks it like any other host's.

    Raises:
        GatewayError: the public key file cannot be read or is not one OpenSSH public key line.
    """
    path = os.path.join(directory, HOST_KEY + ".pub")
    try:
        with open(path, encoding="ascii") as fh:
            fields = fh.read().split()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise GatewayError(f"gateway_dir: cannot read the gateway's host key {path}: {exc}") from exc
    if len(fields) < 2 or not fields[0].startswith("ssh-"):
        raise GatewayError(f"gateway_dir: {path} is not an OpenSSH public key")
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {fields[0]} {fields[1]}"


def _differs(path: str, content: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read() != content
    except FileNotFoundError:
        return True


def sync_keys(directory: str, lock_dir: str, vms: Iterable[dict], check_mode: bool = False) -> bool:
    """Make ``<directory>/keys/`` hold exactly the keys files for ``vms`` (see :func:`key_grants`).

    Creates missing owner accounts (:func:`ensure_account`), writes each changed file atomically and
    removes the files of accounts left without any key (the account stays, unable to log in), all under
    the host flock ``<lock_dir>/gateway.lock`` so two module runs never interleave their views.

    Returns:
        whether a file changed (in check mode: would change; nothing is written or created).

    Raises:
        GatewayError: an account could not be created or a file not written (the path and error named).
    """
    wanted = {account: authorized_keys(keys) for account, keys in key_grants(vms).items()}
    wanted = {account: text for account, text in wanted.items() if text}
    keys_dir = os.path.join(directory, "keys")
    if check_mode:
        present = set(os.listdir(keys_dir)) if os.path.isdir(keys_dir) else set()
        stale = {e for e in present if e.startswith(ACCOUNT_PREFIX)} - set(wanted)
        return bool(stale) or any(_differs(os.path.join(keys_dir, a), text) for a, text in wanted.items())
    changed = False
    try:
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        with _flock.exclusive(os.path.join(lock_dir, "gateway.lock")):
            gid = group_id()
            _ensure_dir(keys_dir, 0o750, gid)
            for account in sorted(wanted):
                ensure_account(account, os.path.join(directory, SHELL))
                changed |= _write_atomic(os.path.join(keys_dir, account), wanted[account], 0o640, gid)
            for entry in sorted(os.listdir(keys_dir)):
                if entry.startswith(ACCOUNT_PREFIX) and entry not in wanted:
                    os.unlink(os.path.join(keys_dir, entry))
                    changed = True
    except OSError as exc:
        raise GatewayError(f"gateway_dir: cannot update the keys in {keys_dir}: {exc}") from exc
    return changed
