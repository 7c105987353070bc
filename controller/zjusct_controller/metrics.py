"""Prometheus metrics of the controller (prometheus-client, one registry per :class:`Metrics`).

* ``zjusct_controller_reconciles_total`` (counter): reconciles run;
* ``zjusct_controller_reconcile_errors_total`` (counter): reconciles that raised (API errors);
* ``zjusct_controller_launcher_pods_created_total`` (counter): launcher Pods this process created;
* ``zjusct_controller_api_requests_total{method}`` (counter): requests the reconciles sent to the API server
  (kopf's watch streams are not counted);
* ``zjusct_cloudvm_phase{phase}`` (gauge): CloudVMs per status phase, as last reconciled by this process;
* ``zjusct_cloudvm_creation_to_running_seconds`` (histogram): CloudVM creationTimestamp -> its first boot
  (bootID 1) Running;
* ``zjusct_cloudvm_start_to_running_seconds`` (histogram): launcher Pod creation (the start request carried
  out) -> Running, every boot.

The histograms follow KubeVirt's phase-transition histograms (``kubevirt_vmi_phase_transition_time_from_creation
_seconds``). Times are measured on the controller's clock against the API server's timestamps (whole seconds).
"""

from __future__ import annotations

import datetime
import threading
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import PHASES
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

BUCKETS = (5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800, 3600)


def _seconds_since(rfc3339: Optional[str], now: datetime.datetime) -> Optional[float]:
    if not rfc3339:
        return None
    try:
        then = datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (now - then).total_seconds())


class Metrics:
    """The controller's metrics; :meth:`serve` exposes them on ``/metrics`` of a port."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("zjusct_controller_reconciles", "Reconciles run", registry=self.registry)
        self.errors = Counter("zjusct_controller_reconcile_errors", "Reconciles that raised", registry=self.registry)
        self.pods_created = Counter("zjusct_controller_launcher_pods_created", "Launcher Pods created",
                                    registry=self.registry)
        self.api_requests = Counter("zjusct_controller_api_requests", "API requests sent by reconciles",
                                    ["method"], registry=self.registry)
        self.phase = Gauge("zjusct_cloudvm_phase", "CloudVMs per status phase", ["phase"], registry=self.registry)
        self.creation_to_running = Histogram("zjusct_cloudvm_creation_to_running_seconds",
                                             "CloudVM creation to its first boot Running", buckets=BUCKETS,
                                             registry=self.registry)
        self.start_to_running = Histogram("zjusct_cloudvm_start_to_running_seconds",
                                          "Launcher Pod creation to Running", buckets=BUCKETS, registry=self.registry)
        self._phases: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = dict.fromkeys(PHASES, 0)
        self._lock = threading.Lock()
        for phase in PHASES:
            self.phase.labels(phase=phase).set(0)

    def set_phase(self, key: tuple[str, str], phase: Optional[str]) -> None:
        """Record the phase of one VM (None: the VM is gone) and update the per-phase gauge."""
        with self._lock:  # O(1): only the old and the new phase's gauges move (was a count over every VM)
            old = self._phases.pop(key, None) if phase is None else self._phases.get(key)
            if phase is not None:
                self._phases[key] = phase
            if old == phase:
                return
            if old is not None:
                self._counts[old] -= 1
                self.phase.labels(phase=old).set(self._counts[old])
            if phase is not None:
                self._counts[phase] = self._counts.get(phase, 0) + 1
                self.phase.labels(phase=phase).set(self._counts[phase])

    def became_running(self, vm: dict, boot_id: int, pod_created: Optional[str]) -> None:
        """Observe the histograms for a transition to Running of ``boot_id``."""
        now = datetime.datetime.now(datetime.UTC)
        since_pod = _seconds_since(pod_created, now)
        if since_pod is not None:
            self.start_to_running.observe(since_pod)
        if boot_id == 1:
            since_creation = _seconds_since(vm["metadata"].get("creationTimestamp"), now)
            if since_creation is not None:
                self.creation_to_running.observe(since_creation)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)
