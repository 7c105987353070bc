"""Benchmark: control-plane overhead of the single-host backend.

Measures, in one run on this machine:

* ``vm_start.yml`` on an existing stopped VM, wall time, minus the guest's own boot time (the
  launcher's ``readyAt - startedAt`` of that boot): the collection's overhead (goal <= 3 s).
* the same for ``vm_stop.yml`` minus the guest's shutdown time (the launcher's ``finishedAt`` in
  ``result-<boot>.json`` minus the ``ts`` of the last stop's first ``graceful stop sent`` log line), reported for
  information. Launcher times are RFC 3339 with milliseconds; fractions of a second are kept.

The VM boots under QEMU/TCG here, so the absolute times are dominated by the guest; the overhead is
the figure to watch. Usage (as root, after ``make setup``)::

    python bench/host_backend.py [--rounds 2]

Prints a table; exits non-zero only when a playbook fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))
START_TASK = "Start the VM and wait until its SSH answers"  # playbooks/vm_start.yml


def _ts(value: str) -> float:
    """UNIX seconds (fraction kept) of the launcher's RFC 3339 UTC time, e.g. ``2026-12-01T05:30:00.123Z``."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _shutdown_s(state: Path, log: Path, boot: int) -> float:
    """Guest shutdown of boot ``boot``: launcher finishedAt minus the first "graceful stop sent" of the log's last stop
    (attempt 1; the launcher repeats the request every stopRetryIntervalSeconds) (nan if absent)."""
    result = state / f"result-{boot}.json"
    finished = json.loads(result.read_text()).get("finishedAt") if result.exists() else None
    lines = [json.loads(x) for x in (log.read_text().splitlines() if log.exists() else []) if x.startswith("{")]
    sent = [x["ts"] for x in lines if x.get("msg") == "graceful stop sent" and x.get("attempt", 1) == 1]
    if not finished or not sent:
        return float("nan")
    return _ts(finished) - _ts(sent[-1])


def host_setup(root: Path, image: str | None = None, subnet: str = "10.215.0.0/24",
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """A host backend of its own under ``root``: the host config (``root/host.json``, store, volumes, state and
    logs under ``root``, a private netns ``zjc-bench-<tag>`` with ``subnet``, no NAT, the launcher from this
    checkout) and an ssh key pair ``root/key`` (+ ``.pub``). Nothing runs yet; the netns is made by the first
    ``vm_start``.

    Args:
        root: an empty directory (removed by :func:`host_cleanup`).
        image: the image set's name (manifest ``name``) the VMs boot; None: the newest set in the cache.

    Returns:
        ``(config, env)``: the host config (dict of ``host.json``) and the environment for ``ansible-playbook``.

    Raises:
        SystemExit: no image set in the cache.
    """
    tag = uuid.uuid4().hex[:6]
    if image is None:
        images = sorted((CACHE / "images").glob("*/manifest.json"))
        if not images:
            raise SystemExit("no image set in the cache: run the tests or playbooks/guest_image.yml first")
        image = json.loads(images[-1].read_text())["name"]
    config = {
        "node": "bench", "store_path": str(root / "cloud.db"), "images_dir": str(CACHE / "images"),
        "default_image": image, "volumes_dir": str(root / "volumes"),
        "state_dir": str(root / "state"), "runtime_dir": f"/run/zjc-bench-{tag}", "log_dir": str(root / "log"),
        "netns": f"zjc-bench-{tag}", "subnet": subnet, "nat": False,
        # TCG boots on this loaded 2-core machine took > 10 min at load 12-20 (the e2e tests allow 30 min too)
        "readiness_timeout_seconds": 1800,
        "launcher_command": [sys.executable, "-m", "zjusct_launcher"], "launcher_pythonpath": str(REPO / "launcher"),
    }
    (root / "host.json").write_text(json.dumps(config))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "key")], check=True)
    env = dict(os.environ, ZJUSCT_CLOUD_CONFIG=str(root / "host.json"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    return config, env


def playbook(name: str, env: dict[str, str], extra: Sequence[str] = (), json_output: bool = False,
             ) -> tuple[float, dict[str, Any] | None]:
    """Run ``playbooks/<name>.yml`` with ``-e owner=bench`` (and ``extra`` arguments) from the checkout.

    Args:
        env: the environment (:func:`host_setup`'s, or another backend's).
        json_output: use the ``ansible.posix.json`` stdout callback and return its document.

    Returns:
        ``(wall seconds, the JSON document or None)``.

    Raises:
        SystemExit: the playbook failed (its output tail in the message).
    """
    run_env = dict(env, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json") if json_output else env
    t0 = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), f"playbooks/{name}.yml", "-e", "owner=bench",
                           *extra], cwd=REPO, env=run_env, check=False, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout[proc.stdout.index("{"):]) if json_output else None


def start_task(doc: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """``(start, end, result)`` of vm_start.yml's cloudvm task in an ``ansible.posix.json`` document (epoch s)."""
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == START_TASK:
                d = task["task"]["duration"]
                return _ts(d["start"]), _ts(d["end"]), task["hosts"]["localhost"]
    raise RuntimeError(f"no task {START_TASK!r} in the playbook's output")


def key_args(root: Path) -> list[str]:
    """The ``-e ssh_public_key_file=...`` of the key :func:`host_setup` made."""
    return ["-e", f"ssh_public_key_file={root / 'key'}.pub"]


def last_guest_boot(config: dict[str, Any], vm: str = "default_bench") -> float:
    """Seconds of the last boot of ``vm`` (state dir name ``<namespace>_<name>``) from the launcher's spawn
    (``spawned-<boot>``) to its ready marker (``readyAt``, else the marker's mtime): the guest's own boot time."""
    state = Path(config["state_dir"]) / "vms" / vm
    boot = max(int(p.stem.split("-")[1]) for p in state.glob("boot-*.json"))
    spawned = json.loads((state / f"spawned-{boot}").read_text())
    ready = state / f"ready-{boot}"
    ready_at = json.loads(ready.read_text()).get("readyAt") if ready.read_text().strip().startswith("{") else None
    return (_ts(ready_at) if ready_at else ready.stat().st_mtime) - float(spawned["time"])


def host_cleanup(root: Path, config: dict[str, Any], env: dict[str, str]) -> None:
    """Delete the VM ``bench`` with its volume (``vm_delete.yml``), the netns, the runtime dir and ``root``."""
    subprocess.run([str(VENV_BIN / "ansible-playbook"), "playbooks/vm_delete.yml", "-e", "owner=bench",
                    "-e", "delete_volume=true"], cwd=REPO, env=env, check=False, capture_output=True)
    subprocess.run(["ip", "netns", "del", config["netns"]], check=False, capture_output=True)
    shutil.rmtree(config["runtime_dir"], ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zjc-bench-"))
    config, env = host_setup(root)
    rows = []
    try:
        playbook("vm_start", env, key_args(root))  # creates the VM and its volume, first boot
        playbook("vm_stop", env)
        for _ in range(args.rounds):
            wall, _doc = playbook("vm_start", env, key_args(root))
            guest = last_guest_boot(config)
            boot = max(int(p.stem.split("-")[1]) for p in (root / "state" / "vms" / "default_bench").glob(
                "boot-*.json"))
            stop_wall, _doc = playbook("vm_stop", env)
            shutdown = _shutdown_s(root / "state" / "vms" / "default_bench",
                                   root / "log" / "default_bench.launcher.log", boot)
            rows.append((wall, guest, stop_wall, shutdown))
    finally:
        host_cleanup(root, config, env)
    print(f"{'round':>5} {'vm_start wall s':>16} {'guest boot s':>13} {'overhead s':>11} {'vm_stop wall s':>15} "
          f"{'guest shutdown s':>17} {'stop overhead s':>16}")
    for i, (wall, guest, stop_wall, shutdown) in enumerate(rows, 1):
        print(f"{i:>5} {wall:>16.2f} {guest:>13.2f} {wall - guest:>11.2f} {stop_wall:>15.2f} {shutdown:>17.2f} "
              f"{stop_wall - shutdown:>16.2f}")
    overhead = statistics.median(w - g for w, g, _, _ in rows)
    stop = statistics.median(s - d for _, _, s, d in rows)
    print(f"median control-plane overhead (absolute, load average {os.getloadavg()[0]:.1f}): vm_start "
          f"{overhead:.2f} s (goal <= 3 s: {'met' if overhead <= 3 else 'NOT met'}, {overhead / 3:.2f}x the goal); "
          f"vm_stop {stop:.2f} s (no goal{'; nan: the launcher left no stop time' if stop != stop else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
