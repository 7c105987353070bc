"""The backend choice (docs/architecture.md "The backend choice"): the modules and the inventory plugin name the same
two backends; each keeps its own default, written once and stated in its documentation and on that page."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.doc_fragments.cloudvm_backend import ModuleDocFragment
from ansible_collections.zjusct.cloud.plugins.inventory import cloudvm as inventory_plugin
from ansible_collections.zjusct.cloud.plugins.module_utils import backend
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _inventory

REPO = Path(__file__).resolve().parents[3]


def _source_option() -> dict:
    return yaml.safe_load(inventory_plugin.DOCUMENTATION)["options"]["source"]


def test_the_modules_and_the_inventory_name_the_same_backends() -> None:
    option = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]["backend"]
    assert set(backend.BACKENDS) == set(_inventory.SOURCES) == set(_source_option()["choices"]) == \
        set(option["choices"])


def test_the_modules_default_to_host_and_read_zjusct_cloud_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.BACKEND_ENV, raising=False)
    assert backend.resolve_backend({}) == backend.DEFAULT_BACKEND == "host"
    monkeypatch.setenv("ZJUSCT_CLOUD_BACKEND", "kubernetes")
    assert backend.resolve_backend({}) == "kubernetes"
    assert backend.resolve_backend({"backend": "host"}) == "host"


def test_the_inventory_defaults_to_kubernetes_and_reads_its_own_variable() -> None:
    source = _source_option()
    assert source["default"] == _inventory.DEFAULT_SOURCE == _inventory.InventoryOptions().source == "kubernetes"
    assert _inventory.InventoryOptions.from_options(lambda name: None).source == _inventory.DEFAULT_SOURCE
    assert source["env"] == [{"name": "ZJUSCT_CLOUD_INVENTORY_SOURCE"}]


def test_the_page_states_both_defaults() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page[page.index("## The backend choice"):page.index("## A module's shape")]
    assert "| option `backend` | `host` | `ZJUSCT_CLOUD_BACKEND` |" in section
    assert "| option `source` | `kubernetes` | `ZJUSCT_CLOUD_INVENTORY_SOURCE` |" in section
