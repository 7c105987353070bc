"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that of several controller processes (Deployment
replicas) only one reconciles (docs/controller.md "Deployment").

The same rules as client-go's leaderelection: a candidate takes the Lease when it is absent, has no holder, or its
record (holder, renewTime, leaseTransitions) has not changed for ``lease_s`` seconds *as observed by this
candidate's monotonic clock* (no comparison of clocks across machines); every write is a replace carrying the
read ``resourceVersion``, so two candidates never both succeed (the loser gets 409 Conflict). The leader renews
every ``renew_s`` seconds; when it cannot renew for ``lease_s - renew_s`` seconds it must stop reconciling at
once (:func:`__main__.main` exits the process: the Pod restarts as a candidate) - before another candidate can
consider the Lease expired. On a clean shutdown the leader clears ``holderIdentity`` so a standby takes over
within ``retry_s`` instead of ``lease_s``.

Kopf's own peering was not used: it needs two extra CRDs (KopfPeering / ClusterKopfPeering) and pauses rather than
fences; a Lease needs only the ``leases`` rights the controller role already grants.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("zjusct_controller.leader")


class LeaderElector:
    """Acquire and hold the Lease ``namespace/name`` as ``identity``.

    Args:
        api: a kubernetes ``ApiClient``.
        namespace, name: the Lease (created when absent).
        identity: this candidate's unique name (the Pod name in a Deployment; host:pid for a process).
        lease_s: seconds a non-renewed Lease stays valid (``spec.leaseDurationSeconds``, default 15).
        renew_s: seconds between renewals (default 5; must be < ``lease_s``).
        retry_s: seconds between acquisition attempts (default 2).
    Raises:
        ValueError: ``renew_s >= lease_s`` or a non-positive period.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str, *, lease_s: int = 15,
                 renew_s: float = 5.0, retry_s: float = 2.0) -> None:
        if not 0 < renew_s < lease_s or retry_s <= 0:
            raise ValueError(f"leader election: need 0 < renew ({renew_s}) < lease ({lease_s}) and retry > 0")
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_s, self.retry_s = lease_s, renew_s, retry_s
        self._observed: Optional[tuple[object, ...]] = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self.leading = threading.Event()

    @staticmethod
    def _now() -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    def _try(self) -> bool:
        """One attempt to acquire or renew; True when this candidate holds the Lease afterwards."""
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                             labels={"app.kubernetes.io/name": "zjusct-cloud"}),
                spec=client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.lease_s,
                                        acquire_time=self._now(), renew_time=self._now(), lease_transitions=0))
            try:
                self.coord.create_namespaced_lease(self.namespace, body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            return True
        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.holder_identity
        expired = now - self._observed_at >= (spec.lease_duration_seconds or self.lease_s)
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = self._now()
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = self.lease_s
        spec.renew_time = self._now()
        lease.spec = spec
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease)  # carries resourceVersion
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def acquire(self) -> bool:
        """Block until this candidate leads (True) or :meth:`stop` was called (False)."""
        while not self._stop.is_set():
            try:
                if self._try():
                    log.info("leader election: %s now holds lease %s/%s", self.identity, self.namespace, self.name)
                    self.leading.set()
                    return True
            except Exception as exc:  # API down: keep trying
                log.warning("leader election: %s", exc)
            self._stop.wait(self.retry_s)
        return False

    def hold(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread; call ``on_lost`` once when the Lease is lost or cannot be renewed in time."""
        def loop() -> None:
            last_ok = time.monotonic()
            while not self._stop.wait(self.renew_s):
                try:
                    if self._try():
                        last_ok = time.monotonic()
                        continue
                    log.error("leader election: lease %s/%s taken by another candidate", self.namespace, self.name)
                except Exception as exc:
                    if time.monotonic() - last_ok < self.lease_s - self.renew_s:
                        log.warning("leader election: renew failed, retrying: %s", exc)
                        continue
                    log.error("leader election: could not renew for %.0f s: %s", time.monotonic() - last_ok, exc)
                self.leading.clear()
                on_lost()
                return
        t = threading.Thread(target=loop, name="leader-renew", daemon=True)
        t.start()
        return t

    def stop(self, release: bool = True) -> None:
        """Stop acquiring/renewing; with ``release`` clear the holder so a standby takes over at once."""
        self._stop.set()
        if release and self.leading.is_set():
            self.leading.clear()
            try:
                lease = self.coord.read_namespaced_lease(self.name, self.namespace)
                if lease.spec and lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = None
                    self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
            except Exception as exc:  # the Lease then expires after lease_s
                log.warning("leader election: release failed: %s", exc)
