# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CloudVM API port: what the one lifecycle (:mod:`cloudvm.lifecycle`) needs from a backend.

Two adapters implement it (docs/architecture.md, "One lifecycle, two adapters"):

* :class:`k8s.cloudvm.KubernetesCloudVMApi`: CloudVM custom resources through kube-apiserver; the API server
  admits every write (CRD schema, CEL rules, the owner policy) and the controller reconciles in the background.
* :class:`host.cloudvm.HostCloudVMApi`: the host store; its writes do what admission does on Kubernetes (spec
  validation, the root volume and its claim rules, the owner's quota in the write transaction, the audit record)
  and its reads run the host's reconcile pass (:class:`host.reconciler.HostReconciler`, the controller's
  counterpart), so a read returns a status as current as the controller would keep it.

Objects are CloudVM dicts in the API's shape (``metadata`` with ``namespace``, ``name``, ``uid``, ``generation``,
``resourceVersion``, ``labels``; ``spec``; ``status``). Every method raises :class:`model.lifecycle.CloudVMError`
(the one error root's CloudVM branch) for a refusal or failure, with the API's field path in its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError


class Conflict(CloudError):
    """The object changed (or appeared, or went) since it was read: the lifecycle re-plans from a fresh read."""


@dataclass(frozen=True)
class RootVolume:
    """What a create asks of the root volume when the backend makes it (host: ``image`` and ``volume_size_mib``,
    the module options; the Kubernetes adapter ignores both, its claim is made by ``root_volume_claim``)."""

    image: Optional[str] = None
    size_mib: Optional[int] = None


@dataclass(frozen=True)
class Access:
    """Who asks to act on a CloudVM, for what: cloudvm_info's ``authorize`` (``owner``, ``operator``, ``action``)."""

    owner: str
    operator: bool
    action: str


class CloudVMApi(Protocol):
    """A backend's CloudVMs (see the module docstring).

    Attributes:
        backend: ``host`` or ``kubernetes``.
        reconciles_in_background: True when something keeps reconciling without the module (the controller):
            then a boot refused for now (Unschedulable, another writer) may still start during a wait, and a delete
            completes on its own. False (the host): the module's reads are the only reconcile passes, so such a
            boot fails the wait at once, and a delete waits for the VM to be off and then removes it.
        ignored_options: module options this backend does not use -> why (each one given gets a warning).
        ssh_gateway: True when the backend's SSH gateway grants each VM the keys of the boot its guest runs
            (the host with ``gateway_dir`` set): the key-change warning names it too.
    """

    backend: str
    reconciles_in_background: bool
    ignored_options: dict
    ssh_gateway: bool

    def get(self, namespace: str, name: str) -> Optional[dict]:
        """The CloudVM with a current status, or None when it does not exist."""

    def create(self, body: dict, dry_run: bool, root_volume: RootVolume) -> dict:
        """Admit and store a new CloudVM (``dry_run``: admit only). Raises :class:`Conflict` when it exists."""

    def replace(self, body: dict, dry_run: bool) -> dict:
        """Admit and store ``body`` over the CloudVM whose ``metadata.resourceVersion`` it carries. Raises
        :class:`Conflict` when the stored one changed since (or is gone)."""

    def delete(self, namespace: str, name: str, dry_run: bool, delete_volume: bool) -> None:
        """Delete the CloudVM (already gone: nothing). Without background reconciling the VM must be off."""

    def delete_kept_volume(self, namespace: str, name: str, owner: str, operator: bool, dry_run: bool) -> Optional[str]:
        """Delete the root volume a deleted CloudVM ``namespace/name`` kept (its default claim ``<name>-root``),
        when ``owner`` owns it (or ``operator``) and nothing holds or writes it; returns its name, None when there
        is none. Raises CloudVMError when it is another owner's, held or written, or the backend keeps volumes."""

    def list(self, namespace: Optional[str], name: Optional[str], owner: Optional[str],
             label_selector: str) -> list:
        """The CloudVMs matching every filter given (``label_selector`` in the Kubernetes grammar), without acting."""

    def launched_boot(self, vm: dict) -> Optional[int]:
        """The newest bootID of ``vm`` (as just read) whose launcher was made, so whose guest's keys are fixed
        (host: the newest boot config on disk; Kubernetes: the boot its status describes), None when none was."""

    def running_doubt(self, vm: dict) -> Optional[str]:
        """Why the status of ``vm`` (as just read), which says Running for ``spec.bootID``, cannot be trusted, or
        None when it can. Kubernetes: the launcher Pod ``status.pod`` is gone, being deleted or not Ready
        (:func:`model.launcher_pod.doubt`; the status is written by the controller alone, which may be down), one
        GET; None when the Pod cannot be read (403, API unreachable): the status is then trusted as before. Host:
        always None (every read derives the status from what runs)."""

    def boot_node_out_of_service(self, vm: dict) -> bool:
        """True when the node ``status.node`` of ``vm`` (as just read) carries the out-of-service taint and is not
        Ready (:func:`model.lifecycle.stated_off`: the operator's statement that the node is off), so a start asks for
        a new boot whatever the status still says. Kubernetes: one GET of the Node; False when it cannot be read
        (403: a tenant may not read Nodes; gone; the API not reachable). Host: always False (one host, no nodes to
        lose)."""

    def pause(self, namespace: str, name: str, seconds: float) -> None:
        """Wait until the CloudVM may have changed, at most ``seconds`` (between two reads of a wait)."""

    def ask_access(self, vm: dict, access: Access) -> None:
        """Ask the backend's own authority whether ``access`` may act on ``vm`` (the Kubernetes API server, with a
        server-side dry run); raises CloudVMError (``reason: Forbidden``) when it refuses. The host has none."""

    def record_refusal(self, vm: dict, access: Access, error: CloudError) -> None:
        """Record a refusal of ``access`` to ``vm`` (the host's audit trail; Kubernetes: its API server did)."""
