"""Fixtures of the AWX job tests: the RBD-backed single-host cloud of tests/e2e/backup (imported, not copied)."""
# ruff: noqa: F401  (pytest fixtures re-exported for this directory)

from __future__ import annotations

from tests.e2e.backup.conftest import rbd_cloud
from tests.integration.ceph.conftest import ceph_cluster
