"""Shared pytest setup for zjusct.cloud.

* Puts the checkout on ``sys.path`` as ``ansible_collections.zjusct.cloud`` (through the
  ``.collections`` link made by ``hack/setup-collection.sh``) so tests import module_utils the way
  Ansible does.
* Enforces the real-component rule: a test marked ``k8s``, ``kubelet``, ``multinode``, ``ceph``, ``netns`` or
  ``guest`` whose component is missing FAILS when ``CI=true`` and is skipped with the reason printed otherwise.
* Runs the local cluster's tests (tests/integration/localcluster) first in a session: each of their clusters takes
  the machine's real-node lock and gives it back, while the real node of tests/integration/k8s_node holds that lock
  from its first test to the session's end. Among them, the tests that bring up a cluster of their own
  (``hack/cluster.sh``, ``make quickstart-kubernetes``) run before those on the package's shared ``local_cluster``,
  which holds the lock from its first test to its package's last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / ".collections"
CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))

if not (COLLECTIONS / "ansible_collections" / "zjusct" / "cloud").exists():
    subprocess.run([str(REPO / "hack" / "setup-collection.sh")], check=True)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
if str(REPO / "launcher") not in sys.path:
    sys.path.insert(0, str(REPO / "launcher"))

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# Every guest the suite boots on this machine, from any lane, takes one of these boot slots (launcher
# ``bootSlots``, host config ``max_concurrent_boots``, controller ``maxConcurrentBoots``): TCG boots are CPU-bound,
# and more of them than CPUs starve each other until systemd's unit timeouts fail them (docs/testing.md).
TEST_BOOT_SLOT_DIR = "/run/lock/zjusct-test/boot-slots"
TEST_BOOT_SLOTS = int(os.environ.get("ZJUSCT_TEST_BOOT_SLOTS", "0")) or max(1, len(os.sched_getaffinity(0)))


def boot_slots() -> dict:
    """The launcher's ``bootSlots`` object every test guest uses."""
    return {"directory": TEST_BOOT_SLOT_DIR, "count": TEST_BOOT_SLOTS}


def require(component: str, ok: bool, why: str) -> None:
    """Fail (under CI) or skip (elsewhere) the running test when a real component is missing.

    Args:
        component: the marker name (``k8s``, ``kubelet``, ``ceph``, ``netns``, ``guest``).
        ok: whether the component is present.
        why: what is missing and how to get it, printed in the failure or skip message.
    """
    if ok:
        return
    message = f"real component '{component}' missing: {why}"
    if IN_CI:
        pytest.fail(message + " (CI=true: a missing component is a failure, not a skip)")
    pytest.skip(message)


def require_real_node() -> None:
    """The ``kubelet`` gate: root, containerd, runc, ctr, the CNI plugins and the kubelet binary."""
    from tests.cluster import RealNode

    reason = RealNode.missing_reason()
    require("kubelet", reason is None, f"a real node needs {reason}")


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(autouse=True)
def _component_gate(request: pytest.FixtureRequest) -> None:
    markers = {m.name for m in request.node.iter_markers()}
    if "netns" in markers:
        require("netns", _is_root() and shutil.which("ip") is not None and Path("/dev/net/tun").exists(),
                "needs root, iproute2 and /dev/net/tun (run hack/install-deps.sh as root)")
    if "guest" in markers:
        require("guest", shutil.which("qemu-system-x86_64") is not None,
                "qemu-system-x86_64 not installed (hack/install-deps.sh)")
    if "kubelet" in markers:
        require_real_node()
    if "multinode" in markers:
        from zjusct_localcluster.cluster import missing_reason

        reason = missing_reason()
        require("multinode", reason is None, f"a local cluster needs {reason}")
    if "ceph" in markers:
        require("ceph", shutil.which("ceph-mon") is not None and shutil.which("rbd") is not None,
                "ceph-mon/rbd not installed (hack/install-deps.sh)")
LOCAL_CLUSTER_TESTS = str(REPO / "tests" / "integration" / "localcluster") + os.sep


@pytest.hookimpl(trylast=True)  # after pytest-random-order's shuffle, which keeps the relative order otherwise
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the local cluster's tests to the front, those on the shared ``local_cluster`` last among them (see the
    module docstring); the shuffled order is kept otherwise."""
    first = [i for i in items if str(i.path).startswith(LOCAL_CLUSTER_TESTS)]
    if first:
        first.sort(key=lambda i: "local_cluster" in getattr(i, "fixturenames", ()))  # stable: own clusters first
        items[:] = first + [i for i in items if not str(i.path).startswith(LOCAL_CLUSTER_TESTS)]


# Seconds spent per test module (setup + call + teardown of its tests), written by pytest_terminal_summary to the
# file named by ZJUSCT_TEST_TIMES when set (hack/test.sh prints the slowest modules of all lanes at the end of a run).
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    path = os.environ.get("ZJUSCT_TEST_TIMES")
    if path and _MODULE_SECONDS:
        with open(path, "w", encoding="utf-8") as fh:
            for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
                fh.write(f"{seconds:.0f} {module}\n")


from tests.guest_image_fixture import guest_image  # noqa: E402,F401
