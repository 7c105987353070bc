"""module_utils/k8s/client.py imports the kubernetes library only when a Kubernetes client is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import client

COLLECTIONS = Path(__file__).resolve().parents[3] / ".collections"


def _imports_kubernetes(statement: str) -> bool:
    """Whether running ``statement`` in a fresh interpreter leaves the kubernetes package imported."""
    code = f"import sys\n{statement}\nprint('kubernetes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(COLLECTIONS), "PATH": "/usr/bin:/bin"}).stdout
    return out.strip() == "True"


def test_the_host_backends_module_path_does_not_import_kubernetes() -> None:
    # what cloudvm and cloudvm_info import on the host backend (cloudvm_module picks the backend at run time)
    assert not _imports_kubernetes(
        "from ansible_collections.zjusct.cloud.plugins.module_utils import cloudvm_module\n"
        "from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm\n"
        "assert cloudvm_module.cloudvm_argument_spec()['kubeconfig']")


def test_api_exception_is_the_librarys_class_on_first_use() -> None:
    assert _imports_kubernetes(
        "from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import ApiException\n"
        "from kubernetes.client.exceptions import ApiException as library\n"
        "assert ApiException is library")


def test_other_missing_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        _ = client.NoSuchName  # type: ignore[attr-defined]


def test_a_kubernetes_install_that_does_not_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("K8S_AUTH_KUBECONFIG", raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes.client", None)  # import kubernetes.client raises ImportError
    with pytest.raises(RuntimeError, match="'kubernetes' does not import on the managed node"):
        client.api_client({}, RuntimeError)
