"""The real control plane's fixtures (defined in tests/integration/k8s/conftest.py)."""
# ruff: noqa: F401
from tests.integration.k8s.conftest import _k8s_component_gate, k8s_api, k8s_cluster
