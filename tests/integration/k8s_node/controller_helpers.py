"""What the controller tests on the real node share: the controller as a subprocess with its ServiceAccount's
rights (tests/integration/controller_process.py, re-exported here), the CRD, CloudVM manifests, waits on a
CloudVM's status and launcher Pods (printing the controller's log and the launcher logs when a wait fails), watches
that record every status and every launcher Pod, ssh into a guest, and an RBD root volume (template clone, PV,
claim) with the cephx user's keyring in a Secret.

Used by test_controller.py, test_controller_rbd.py and test_controller_fencing.py.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.cluster import wait_for
from tests.guest_image_fixture import ansible_playbook
from tests.integration.controller_process import (  # noqa: F401 (re-exported)
    CONTROLLER_ROLE,
    Controller,
    controller_kubeconfig,
    release_launcher_pods,
)

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "config" / "crd" / "cloudvms.cloud.zjusct.io.yaml"
BOOT_TIMEOUT = 1500
LABEL_VM = "cloud.zjusct.io/vm"
UNUSED_PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl unused"  # no boot


def image_archive(work: Path, kind: str) -> dict[str, Any]:
    """Run ``playbooks/<kind>_image.yml`` (``launcher`` or ``controller``) without its own import (the archive is
    cached under ``${ZJUSCT_CACHE}``; a warm run only checks it). Returns the playbook's report,
    ``{"tag", "archive", "key"}``; the caller imports the archive into its nodes.

    Raises:
        AssertionError: the playbook failed (its output's tail in the message).
    """
    report = work / f"{kind}-image-report.json"
    argv = [ansible_playbook(), f"playbooks/{kind}_image.yml", "-e", f'{{"{kind}_image_import": false}}',
            "-e", f"{kind}_image_report_file={report}"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-2000:]}")
    info: dict[str, Any] = json.loads(report.read_text())
    return info


def create_or_keep(create: Callable[[], Any]) -> None:
    """``create()``, an AlreadyExists (409) answer taken as success."""
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def install_crd(k8s_api: Any) -> None:
    """The CloudVM CRD of this checkout, created (or kept) and Established."""
    ext = client.ApiextensionsV1Api(k8s_api)
    (crd,) = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    create_or_keep(lambda: ext.create_custom_resource_definition(crd))
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
             60, "CloudVM CRD Established")


def controller_role_docs() -> list[dict[str, Any]]:
    """The documents of config/rbac/controller-role.yaml."""
    return [d for d in yaml.safe_load_all(CONTROLLER_ROLE.read_text()) if d]


def cloudvm(name: str, pubkey: str, power: str, boot: int) -> dict[str, Any]:
    """A CloudVM of 1 vCPU / 512 MiB whose root volume claim is ``<name>-root``."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": name},
            "spec": {"owner": "alice", "rootVolumeClaim": f"{name}-root", "vcpus": 1, "memoryMiB": 512,
                     "powerState": power, "bootID": boot, "sshAuthorizedKeys": [pubkey]}}


@dataclass
class Vms:
    """CloudVMs and their launcher Pods in one namespace, as the tests read and wait on them."""

    core: Any
    custom: Any
    ns: str
    controller: Controller

    def vm(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)

    def patch_spec(self, name: str, **spec: Any) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def pods(self, name: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=f"{LABEL_VM}={name}").items)

    def dump(self, name: str) -> None:
        """Print what explains a failed wait: the controller's log, the VM's status, the launcher logs."""
        print(self.controller.tail())
        with contextlib.suppress(Exception):
            print(self.vm(name).get("status"))
        for p in self.pods(name):
            with contextlib.suppress(Exception):
                print(self.core.read_namespaced_pod_log(p.metadata.name, self.ns)[-4000:])

    def status_when(self, name: str, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str,
                    interval: float = 1) -> dict[str, Any]:
        """Wait until ``pred(status)`` holds; returns the CloudVM."""
        def check() -> dict[str, Any] | None:
            obj = self.vm(name)
            return obj if pred(obj.get("status") or {}) else None

        try:
            return dict(wait_for(check, timeout, what, interval=interval))
        except BaseException:
            self.dump(name)
            raise

    def launcher_running(self, name: str, timeout: float = 900) -> Any:
        """Wait until the VM has exactly one launcher Pod and its container runs; return that Pod."""
        def check() -> Any:
            pods = self.pods(name)
            if len(pods) != 1 or pods[0].status.phase != "Running":
                return None
            states = [c.state for c in pods[0].status.container_statuses or []]
            return pods[0] if states and states[0].running is not None else None

        try:
            return wait_for(check, timeout, f"{name}: launcher container running", interval=1)
        except BaseException:
            self.dump(name)
            raise


class BackgroundLoop:
    """A loop in a daemon thread from the start of a ``with`` block to its end: subclasses give ``_run``, which
    returns soon after ``_stop`` is set; ``__exit__`` sets it, calls ``_halt`` (to interrupt a blocking call) and
    waits up to ``join_timeout`` s for the thread (0: does not wait)."""

    join_timeout = 0.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Any:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._halt()
        if self.join_timeout:
            self._t.join(timeout=self.join_timeout)

    def _halt(self) -> None:
        """Interrupt what ``_run`` blocks on (nothing here)."""

    def _run(self) -> None:
        raise NotImplementedError


class _WatchThread(BackgroundLoop):
    """A watch of its own in a daemon thread, reconnecting (also across an API server restart) until the ``with``
    block ends; subclasses give the list call and handle each event."""

    def __init__(self) -> None:
        self._w = watch.Watch()
        super().__init__()

    def _halt(self) -> None:
        self._w.stop()

    def _stream(self) -> Any:
        raise NotImplementedError

    def _handle(self, ev: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for ev in self._stream():
                    self._handle(ev)
                    if self._stop.is_set():
                        return
            self._stop.wait(0.5)


class StatusWatch(_WatchThread):
    """Every (bootID, phase, reason) the API server held for the CloudVMs of a namespace, in order (``seen``)."""

    def __init__(self, custom: Any, ns: str) -> None:
        super().__init__()
        self.custom, self.ns = custom, ns
        self.seen: list[tuple[Any, Any, Any]] = []

    def _stream(self) -> Any:
        return self._w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.ns, PLURAL,
                              timeout_seconds=30)

    def _handle(self, ev: dict[str, Any]) -> None:
        st = ev["object"].get("status") or {}
        seen = (st.get("bootID"), st.get("phase"), st.get("reason"))
        if st and (not self.seen or self.seen[-1] != seen):
            self.seen.append(seen)


class PodWatch(_WatchThread):
    """Every launcher Pod event of one VM: the names ever seen and the most launcher Pods alive at once (alive:
    not ended - no terminal phase, no terminated container - and not deleted)."""

    def __init__(self, core: Any, ns: str, vm: str) -> None:
        super().__init__()
        self.core, self.ns, self.vm = core, ns, vm
        self.names: list[str] = []
        self.alive: dict[str, bool] = {}
        self.max_alive = 0
        self.overlaps: list[list[str]] = []

    def _stream(self) -> Any:
        return self._w.stream(self.core.list_namespaced_pod, self.ns, label_selector=f"{LABEL_VM}={self.vm}",
                              timeout_seconds=30)

    def _handle(self, ev: dict[str, Any]) -> None:
        pod = ev["object"]
        name = pod.metadata.name
        if name not in self.names:
            self.names.append(name)
        ended = pod.status.phase in ("Succeeded", "Failed") or any(
            c.state and c.state.terminated for c in pod.status.container_statuses or [])
        self.alive[name] = ev["type"] != "DELETED" and not ended
        now = sorted(n for n, a in self.alive.items() if a)
        self.max_alive = max(self.max_alive, len(now))
        if len(now) > 1:
            self.overlaps.append(now)


def ssh_argv(key: Path, host: str, command: str, connect_timeout: int = 60) -> list[str]:
    return ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR",
            f"root@{host}", command]


def ssh(key: Path, host: str, command: str) -> str:
    """Run ``command`` in the guest as root; its stdout. Retried: sshd sends its banner slightly before it
    accepts logins under heavy load.

    Raises:
        AssertionError: six attempts failed.
    """
    out = None
    for _ in range(6):
        out = subprocess.run(ssh_argv(key, host, command), capture_output=True, text=True, timeout=180, check=False)
        if out.returncode == 0:
            return out.stdout
        time.sleep(5)
    raise AssertionError(f"ssh {host} {command!r}: {out.stderr if out else ''}")


OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def set_out_of_service(core: Any, node: str, on: bool) -> None:
    """Add or remove the taint an operator sets on a node that is off (KEP-2268, ``kubectl taint nodes <node>
    node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``): read-modify-write with the Node's
    resourceVersion, as ``kubectl taint``, retried on a Conflict with the node lifecycle controller's own taint
    updates.

    Raises:
        AssertionError: ten Conflicts in a row.
    """
    for _ in range(10):
        n = core.read_node(node)
        taints = [t for t in (n.spec.taints or []) if t.key != OUT_OF_SERVICE["key"]]
        body = [client.ApiClient().sanitize_for_serialization(t) for t in taints] + ([OUT_OF_SERVICE] if on else [])
        try:
            core.patch_node(node, {"metadata": {"resourceVersion": n.metadata.resource_version},
                                   "spec": {"taints": body}})
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"node {node}: taint update kept conflicting")


def ceph_user_secret(ceph: Any, core: Any, ns: str, user: str, secret: str) -> str:
    """The cephx user QEMU connects as (``profile rbd`` on pool rbd only) and its keyring in the Secret
    ``secret`` of ``ns`` (key ``keyring``). Returns the key (for the tests that assert it leaks nowhere)."""
    keyring = ceph.ceph("auth", "get-or-create", f"client.{user}", "mon", "profile rbd", "osd",
                        "profile rbd pool=rbd")
    key = next(line.split("=", 1)[1].strip() for line in keyring.splitlines() if line.strip().startswith("key"))
    assert len(key) > 20
    core.create_namespaced_secret(ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                                       "type": "Opaque", "stringData": {"keyring": keyring}})
    return str(key)


def fencing_controller_config(ceph: Any, work: Path, launcher_tag: str, guest_image: Any, user: str, secret: str,
                              fence_user: str, **extra: Any) -> Path:
    """``work/controller.json`` for RBD root disks with fencing: the launcher image, the guest image set, TCG and
    the test suite's boot slots, the ``ceph`` section (QEMU's cephx ``user`` whose keyring is in Secret ``secret``)
    and the controller's own fence identity ``client.<fence_user>`` (``profile rbd`` on the monitors allows ``osd
    blocklist add``), its keyring written to ``work/fence.keyring`` (0600). ``extra`` fields are merged in (e.g.
    ``nodeSelector``, ``tolerations``). Returns the config's path."""
    from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS

    keyring = work / "fence.keyring"
    keyring.write_text(ceph.ceph("auth", "get-or-create", f"client.{fence_user}", "mon", "profile rbd", "osd",
                                 "profile rbd pool=rbd"))
    keyring.chmod(0o600)
    cfg = work / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": launcher_tag, "imageDir": str(guest_image.dir),
                               "cmdline": guest_image.default_cmdline, "accel": "tcg",
                               "maxConcurrentBoots": TEST_BOOT_SLOTS, "bootSlotDir": TEST_BOOT_SLOT_DIR, **extra,
                               "ceph": {"monitors": [ceph.mon_host], "user": user, "secretName": secret,
                                        "fenceUser": fence_user, "fenceKeyring": str(keyring)}}))
    return cfg


def ssh_keypair(work: Path) -> tuple[Path, str]:
    """A new ed25519 key without passphrase at ``work/id_ed25519``: ``(private key path, public key line)``."""
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    return key, key.with_suffix(".pub").read_text().strip()


def rbd_root_volume(ceph: Any, core: Any, guest_image: Any, ns: str, claim: str = "vm1-root",
                    ) -> tuple[Rbd, ImageRef, str]:
    """The root volume of a VM as ``rbd_volume`` makes it: a clone of the guest image's template snapshot
    (``rbd/tmpl-guest@base``, imported once per Ceph cluster), its PV (``spec.csi`` as Ceph-CSI names the image;
    no driver installed) and a Bound Block claim ``claim``. Returns ``(rbd, image, pv name)``."""
    rbd = Rbd(Connection(conf=str(ceph.conf), keyring=str(ceph.keyring), timeout=900))
    template = ImageRef("rbd", "tmpl-guest")
    if rbd.info(template.at("base")) is None:
        if rbd.info(template) is None:
            rbd.import_raw(str(guest_image.rootfs), template, timeout=900)
        rbd.snap_create(template.at("base"))
        rbd.snap_protect(template.at("base"))
    image = ImageRef("rbd", f"{ns}-{claim}")
    rbd.clone(template.at("base"), image)
    pv_name = f"{ns}-{claim}"
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeMode": "Block", "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": ns, "name": claim},
                 "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": image.spec,
                         "volumeAttributes": {"pool": image.pool, "imageName": image.image}}}})
    core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": "Block",
                 "volumeName": pv_name, "resources": {"requests": {"storage": "2Gi"}}}})
    wait_for(lambda: core.read_namespaced_persistent_volume_claim(claim, ns).status.phase == "Bound", 120,
             f"{claim} Bound")
    return rbd, image, pv_name


def hostpath_root_volume(core: Any, ns: str, path: Path, claim: str = "vm1-root", size: str = "4Gi") -> str:
    """A filesystem root volume: a PV of the directory ``path`` on the node (hostPath, the launcher finds
    ``root.raw`` in it) pre-bound to the claim ``claim``, and that claim, Bound. Returns the PV's name."""
    pv_name = f"{ns}-{claim}"
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(path), "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": claim}}})
    core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": size}}}})
    wait_for(lambda: core.read_namespaced_persistent_volume_claim(claim, ns).status.phase == "Bound", 120,
             f"{claim} Bound")
    return pv_name


def teardown_vms(vms: Vms, names: list[str], pv_names: list[str]) -> None:
    """After a test: launcher Pods removed at once (no graceful guest stop), the CloudVMs deleted (the
    controller removes its finalizer and releases the Pods), the controller stopped, any Pod it could not release
    (a lost node) released by hand, the PVs deleted; the controller's log printed."""
    core, custom, ns = vms.core, vms.custom, vms.ns
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(ns, label_selector=LABEL_VM, grace_period_seconds=0)
    for name in names:
        with contextlib.suppress(ApiException):
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    if vms.controller.proc is None:
        vms.controller.start()
    with contextlib.suppress(TimeoutError):  # the finalizer goes once the launcher Pods are gone
        wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"], 300,
                 "CloudVMs deleted")
    vms.controller.stop()
    release_launcher_pods(core, ns)  # a launcher Pod of a node still lost, never released by the controller
    for pv_name in pv_names:
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(pv_name)
    print(vms.controller.tail()[-3000:])


def blocklist(ceph: Any) -> set[str]:
    """The OSD blocklist's address entries (``addr:port/nonce``; ``ip:0/0`` blocks every client of that IP). The
    plain output, one ``<address> <expiry>`` per line: ``--format json`` prints two documents (the address list and
    the range list) back to back."""
    out = ceph.ceph("osd", "blocklist", "ls")
    return {line.split()[0] for line in out.splitlines() if line.strip() and ":" in line.split()[0]}


def blocked(address: str, listed: set[str]) -> bool:
    """Whether the client ``address`` (``ip:port/nonce``) is in ``listed`` (:func:`blocklist`), itself or by its
    whole IP (``ip:0/0``)."""
    return address in listed or f"{address.split(':')[0]}:0/0" in listed


class WriterSampler(BackgroundLoop):
    """Until the ``with`` block ends, samples the image's watchers and exclusive-lock owners, then, when they are two
    or more, the OSD blocklist (in that order: the blocklist only grows here, so a client read as a holder and then
    found blocklisted was fenced before any later holder could exist). ``samples``: (time, the holders not
    blocklisted; a single holder is listed without reading the blocklist, as it cannot make two writers).

    The blocklist is read through the ``ceph`` CLI, a Python start-up of ≈ 0.35 CPU-s a call (process accounting
    of a 2026-12-07 CI rehearsal: 657 ``ceph`` calls in all, 3.9 CPU-minutes); reading it for every sample cost
    more CPU than the rest of the sample (two ``rbd`` calls, ≈ 0.07 CPU-s each)."""

    join_timeout = 180.0

    def __init__(self, rbd: Rbd, image: ImageRef, ceph: Any) -> None:
        self.rbd, self.image, self.ceph = rbd, image, ceph
        self.samples: list[tuple[float, list[str]]] = []
        self.errors: list[str] = []
        super().__init__()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                holders = {str(w["address"]) for w in self.rbd.status(self.image)}
                holders |= {str(lk["address"]) for lk in self.rbd.locks(self.image) if lk.get("address")}
                listed = blocklist(self.ceph) if len(holders) > 1 else set()
                self.samples.append((time.monotonic(), sorted(a for a in holders if not blocked(a, listed))))
            except Exception as exc:  # a sample lost under load is recorded, not fatal
                self.errors.append(str(exc)[:200])
            self._stop.wait(1.0)

    def most_live(self) -> int:
        return max((len(live) for _, live in self.samples), default=0)
