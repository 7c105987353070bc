"""Fixtures of the AWX credential tests: the real control plane, CloudVM CRD and writer of tests/integration/
inventory_k8s (imported, not copied)."""
# ruff: noqa: F401  (pytest fixtures re-exported for this directory)

from __future__ import annotations

from tests.integration.inventory_k8s.conftest import inventory_crd, vms
from tests.integration.k8s.conftest import _k8s_component_gate, k8s_api, k8s_cluster, k8s_namespace, tenant_api
