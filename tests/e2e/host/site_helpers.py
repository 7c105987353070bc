"""The host backend's ``hypervisor_*`` variables for a private ``site.yml`` run, shared by the site tests.

tests/e2e/host/test_site.py (ansible-playbook) and tests/e2e/awx/test_awx_site_job.py (the AWX site job template
through ansible-runner) both bring a host up with every path in a temporary directory and a network namespace of
their own; :func:`private_host` builds those variables once and removes the namespace and runtime directory after.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def private_host(guest_image: Any, root: Path, prefix: str, subnet: str, **extra: Any) -> Iterator[dict[str, Any]]:
    """Yield the ``hypervisor_*`` extra vars of a host whose state lives under ``root``; clean up afterwards.

    Args:
        guest_image: the session's ``guest_image`` fixture (its set's parent directory is the images dir, so
            the image role only checks the manifest).
        root: a per-test temporary directory (config in ``root/etc/host.json``, state, logs).
        prefix: start of the namespace and runtime directory names (``<prefix>-<6 hex>``, at most 8 characters
            so the namespace name stays short).
        subnet: the bridge's IPv4 subnet (``10.2xx.0.0/24``; distinct per test module so runs never clash).
        extra: more ``hypervisor_*`` variables (override the defaults: ``hypervisor_nat`` is ``False``).

    Yields:
        The variables; ``hypervisor_netns`` and ``hypervisor_config_path`` name what the test checks.
    """
    tag = uuid.uuid4().hex[:6]
    netns, runtime = f"{prefix}-{tag}", f"/run/{prefix}-{tag}"
    variables: dict[str, Any] = {
        "hypervisor_config_path": str(root / "etc" / "host.json"),
        "hypervisor_state_dir": str(root / "state"),
        "hypervisor_images_dir": str(Path(guest_image.dir).parent),
        "hypervisor_runtime_dir": runtime,
        "hypervisor_log_dir": str(root / "log"),
        "hypervisor_netns": netns,
        "hypervisor_subnet": subnet,
        "hypervisor_nat": False,
        **extra,
    }
    try:
        yield variables
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
        shutil.rmtree(runtime, ignore_errors=True)
