"""The controller's metrics (zjusct_controller.metrics) in their own registry; the scrape over HTTP is checked
in tests/integration/k8s_node/test_controller.py."""

from __future__ import annotations

import datetime

from zjusct_controller.metrics import Metrics


def _ago(seconds: int) -> str:
    then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    return then.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_phase_gauge_counts_vms_per_phase_and_forgets_deleted_ones() -> None:
    m = Metrics()
    m.set_phase(("a", "x"), "Running")
    m.set_phase(("a", "y"), "Running")
    m.set_phase(("a", "y"), "Stopped")
    get = m.registry.get_sample_value
    assert get("zjusct_cloudvm_phase", {"phase": "Running"}) == 1
    assert get("zjusct_cloudvm_phase", {"phase": "Stopped"}) == 1
    m.set_phase(("a", "y"), "Stopped")  # the same phase again counts once
    assert get("zjusct_cloudvm_phase", {"phase": "Stopped"}) == 1
    m.set_phase(("a", "x"), None)
    m.set_phase(("a", "never-seen"), None)
    assert get("zjusct_cloudvm_phase", {"phase": "Running"}) == 0
    assert get("zjusct_cloudvm_phase", {"phase": "Stopped"}) == 1
    assert get("zjusct_cloudvm_phase", {"phase": "Failed"}) == 0


def test_running_transitions_observe_start_and_first_boot_creation_histograms() -> None:
    m = Metrics()
    vm = {"metadata": {"creationTimestamp": _ago(300)}}
    m.became_running(vm, 1, _ago(100))
    m.became_running(vm, 2, _ago(40))
    get = m.registry.get_sample_value
    assert get("zjusct_cloudvm_start_to_running_seconds_count") == 2
    assert 139 <= (get("zjusct_cloudvm_start_to_running_seconds_sum") or 0) <= 150
    assert get("zjusct_cloudvm_creation_to_running_seconds_count") == 1  # bootID 1 only
    assert 299 <= (get("zjusct_cloudvm_creation_to_running_seconds_sum") or 0) <= 310
    assert get("zjusct_cloudvm_start_to_running_seconds_bucket", {"le": "60.0"}) == 1
