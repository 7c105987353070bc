"""Case A3: a cephx secret or keyring passed to the RBD modules never shows up in results or -vvv output."""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd, RbdError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_volume_module import run_volume

pytestmark = pytest.mark.ceph
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLAYBOOK = "/var/cache/zjusct-cloud/venv/bin/ansible-playbook"


@pytest.fixture(scope="module")
def tester(ceph_cluster, tmp_path_factory):
    """A restricted cephx user ``client.tester`` (profile rbd): (secret, keyring path)."""
    ceph_cluster.ceph("auth", "get-or-create", "client.tester", "mon", "profile rbd", "osd", "profile rbd pool=rbd")
    secret = ceph_cluster.ceph("auth", "get-key", "client.tester").strip()
    path = tmp_path_factory.mktemp("kr") / "ceph.client.tester.keyring"
    path.write_text(ceph_cluster.ceph("auth", "get", "client.tester"))
    os.chmod(path, 0o600)
    assert len(secret) > 20
    return secret, str(path)


def play(ceph_cluster, tmp_path, tasks: str, secret: str) -> subprocess.CompletedProcess:
    """Run tasks with -vvv; the secret arrives as the variable ``ceph_secret`` from an extra-vars file (as from
    a vault). Ansible echoes task *source* in warnings, so a secret written literally into a playbook would show
    up there whatever the module does: keep secrets in variables."""
    pb = tmp_path / "play.yml"
    pb.write_text(f"- hosts: localhost\n  gather_facts: false\n  tasks:\n{tasks}")
    (tmp_path / "secrets.yml").write_text(f'ceph_secret: "{secret}"\n')
    env = ceph_cluster.env()
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1", LC_ALL="C.UTF-8",
               CEPH_KEYRING="")
    env.pop("CEPH_KEYRING")
    argv = [PLAYBOOK, "-vvv", "-e", f"@{tmp_path / 'secrets.yml'}", str(pb)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_case_A3_secret_and_keyring_never_in_results_or_verbose_output(ceph_cluster, tester, tmp_path, image_name):
    secret, keyring = tester
    tasks = f"""
    - name: with the secret itself
      zjusct.cloud.rbd_volume:
        name: {image_name}
        size_mib: 8
        ceph_user: tester
        ceph_key: "{{{{ ceph_secret }}}}"
      register: with_key
    - name: with a keyring path
      zjusct.cloud.rbd_volume:
        name: {image_name}
        snapshot: s1
        ceph_user: tester
        ceph_keyring: {keyring}
      register: with_keyring
    - name: a failing call with the secret
      zjusct.cloud.rbd_volume:
        name: {image_name}
        state: absent
        ceph_user: tester
        ceph_key: "{{{{ ceph_secret }}}}"
      ignore_errors: true
    - ansible.builtin.debug: var=with_key
    - ansible.builtin.debug: var=with_keyring
    - ansible.builtin.assert:
        that: [with_key is changed, with_keyring is changed, "with_key.image.size_mib == 8"]
"""
    proc = play(ceph_cluster, tmp_path, tasks, secret)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "has snapshots s1" in out  # the failing call really ran with the secret
    assert secret not in out, "the cephx secret leaked into ansible-playbook -vvv output"
    # the restricted user really authenticated: the image exists and is visible to admin
    admin = Rbd(Connection(conf=str(ceph_cluster.conf)))
    assert [s["name"] for s in admin.snapshots(ImageRef("rbd", image_name))] == ["s1"]


def wrong_key(secret: str) -> str:
    """The cephx secret with every bit of its last key byte flipped: same length, always a different key.

    A cephx secret is base64 of 28 bytes (type u16, created utime_t, len u16, 16 key bytes; src/auth/Crypto.cc
    CryptoKey::encode). Pasting "AAA=" over its last four characters kept the key whenever its last byte was
    already 0x00 (one run in 256) and the call then authenticated."""
    blob = bytearray(base64.b64decode(secret))
    blob[-1] ^= 0xFF
    return base64.b64encode(bytes(blob)).decode()


def test_case_A3_run_result_has_no_secret(ceph_cluster, tester, image_name):
    secret, _ = tester
    p = {"pool": "rbd", "name": image_name, "state": "present", "size_mib": 8, "ceph_user": "tester",
         "ceph_key": secret, "ceph_conf": str(ceph_cluster.conf)}
    rbd = Rbd(Connection.from_params(p))
    assert secret not in repr(rbd.conn)
    res = run_volume(p, rbd)
    assert res["changed"] and secret not in json.dumps(res)
    bad = Rbd(Connection(conf=str(ceph_cluster.conf), user="tester", key=wrong_key(secret)))
    with pytest.raises(RbdError) as err:
        bad.info(ImageRef("rbd", image_name))
    assert secret[:-4] not in str(err.value) and secret[:-4] not in err.value.stderr
    leftovers = [f for f in os.listdir("/tmp") if f.startswith("zjusct-rbd-key-")]
    assert leftovers == [], "key files must be removed after each call"


def test_rbd_backup_module_end_to_end_through_ansible_playbook(ceph_cluster, tester, tmp_path, image_name):
    """present (full, then diff) -> verified -> restored -> restored again (unchanged), as the restricted user
    with its secret; check mode plans without writing; the secret never appears."""
    secret, _ = tester
    dest = tmp_path / "bk"
    conn = 'ceph_user: tester\n        ceph_key: "{{ ceph_secret }}"'
    tasks = f"""
    - zjusct.cloud.rbd_volume:
        name: {image_name}
        size_mib: 16
        owner: alice
        {conn}
    - name: check mode plans a full backup and writes nothing
      zjusct.cloud.rbd_backup: {{name: {image_name}, dest: {dest}, keep: 3}}
      check_mode: true
      register: planned
    - zjusct.cloud.rbd_backup:
        name: {image_name}
        dest: {dest}
        vm: alice
        keep: 3
        {conn}
      register: full
    - zjusct.cloud.rbd_backup:
        name: {image_name}
        dest: {dest}
        vm: alice
        keep: 3
        {conn}
      register: incr
    - zjusct.cloud.rbd_backup:
        state: verified
        dest: {dest}
      register: verified
    - zjusct.cloud.rbd_backup:
        state: restored
        dest: {dest}
        target_name: {image_name}-restored
        {conn}
      register: restored
    - zjusct.cloud.rbd_backup:
        state: restored
        dest: {dest}
        target_name: {image_name}-restored
        {conn}
      register: again
    - ansible.builtin.assert:
        that:
          - planned is changed and planned.type == 'full'
          - full.type == 'full' and incr.type == 'diff' and incr.chain | length == 2
          - verified is not changed and verified.backup_id == incr.backup_id
          - restored is changed and restored.verified_blocks == 4 and restored.backup_id == incr.backup_id
          - again is not changed
"""
    proc = play(ceph_cluster, tmp_path, tasks, secret)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert secret not in out
    assert len([n for n in os.listdir(dest) if not n.startswith(".")]) == 2
