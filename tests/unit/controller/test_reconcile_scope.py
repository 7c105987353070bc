"""A controller started with ``--namespace`` acts only there: the resync and the Node fan-out skip other
namespaces (a stub stands in for the list calls; the real API path is tests/integration/k8s_node)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kubernetes import client
from zjusct_controller.decide import Config
from zjusct_controller.reconcile import Reconciler

CFG = Config(launcher_image="x", image_dir="/x", cmdline="c")


class _Custom:
    def list_cluster_custom_object(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"items": [{"metadata": {"namespace": ns, "name": "vm"}} for ns in ("a", "b")]}


class _Core:
    def list_pod_for_all_namespaces(self, **_: Any) -> Any:
        pods = [SimpleNamespace(metadata=SimpleNamespace(namespace=ns, labels={"cloud.zjusct.io/vm": "vm"}))
                for ns in ("a", "b")]
        return SimpleNamespace(items=pods)


def _reconciler(namespaces: tuple[str, ...]) -> Reconciler:
    r = Reconciler(client.ApiClient(), CFG, namespaces=namespaces)
    r.custom, r.core = _Custom(), _Core()
    return r


def test_namespaced_controller_resyncs_and_fans_out_only_its_namespaces() -> None:
    assert _reconciler(("a",)).all_vms() == [("a", "vm")]
    assert _reconciler(("a",)).vms_on_node("n1") == [("a", "vm")]
    assert _reconciler(()).all_vms() == [("a", "vm"), ("b", "vm")]


def test_every_request_of_the_reconciler_client_is_counted_by_method() -> None:
    api = client.ApiClient()
    sent: list[str] = []
    api.call_api = lambda method, *a, **k: sent.append(method)  # type: ignore[method-assign]
    r = Reconciler(api, CFG)
    api.call_api("GET", "/api/v1/pods")
    api.call_api("PATCH", "/apis/x")
    assert sent == ["GET", "PATCH"]
    get = r.metrics.registry.get_sample_value
    assert get("zjusct_controller_api_requests_total", {"method": "GET"}) == 1
    assert get("zjusct_controller_api_requests_total", {"method": "PATCH"}) == 1
