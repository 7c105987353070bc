"""Benchmark: control-plane overhead of the single-host backend.

Measures, in one run on this machine:

* ``vm_start.yml`` on an existing stopped VM, wall time, minus the guest's own boot time (the
  launcher's ``readyAt - startedAt`` of that boot): the collection's overhead (goal <= 3 s).
* the same for ``vm_stop.yml`` minus the guest's shutdown time (the launcher's ``finishedAt`` in
  ``result-<boot>.json`` minus the ``ts`` of its last ``graceful stop sent`` log line), reported for
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))


def _ts(value: str) -> float:
    """UNIX seconds (fraction kept) of the launcher's RFC 3339 UTC time, e.g. ``2026-12-01T05:30:00.123Z``."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _shutdown_s(state: Path, log: Path, boot: int) -> float:
    """Guest shutdown of boot ``boot``: launcher finishedAt minus its last "graceful stop sent" (nan if absent)."""
    result = state / f"result-{boot}.json"
    finished = json.loads(result.read_text()).get("finishedAt") if result.exists() else None
    sent = [json.loads(x)["ts"] for x in (log.read_text().splitlines() if log.exists() else [])
            if x.startswith("{") and json.loads(x).get("msg") == "graceful stop sent"]
    if not finished or not sent:
        return float("nan")
    return _ts(finished) - _ts(sent[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zjc-bench-"))
    tag = uuid.uuid4().hex[:6]
    images = sorted((CACHE / "images").glob("*/manifest.json"))
    if not images:
        print("no image set in the cache: run the tests or playbooks/guest_image.yml first")
        return 1
    config = {
        "node": "bench", "store_path": str(root / "cloud.db"), "images_dir": str(CACHE / "images"),
        "default_image": json.loads(images[-1].read_text())["name"], "volumes_dir": str(root / "volumes"),
        "state_dir": str(root / "state"), "runtime_dir": f"/run/zjc-bench-{tag}", "log_dir": str(root / "log"),
        "netns": f"zjc-bench-{tag}", "subnet": "10.215.0.0/24", "nat": False,
        "launcher_command": [sys.executable, "-m", "zjusct_launcher"], "launcher_pythonpath": str(REPO / "launcher"),
    }
    (root / "host.json").write_text(json.dumps(config))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "key")], check=True)
    env = dict(os.environ, ZJUSCT_CLOUD_CONFIG=str(root / "host.json"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")

    def playbook(name: str) -> float:
        t0 = time.monotonic()
        proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), f"playbooks/{name}.yml", "-e", "owner=bench",
                               "-e", f"ssh_public_key_file={root / 'key'}.pub"], cwd=REPO, env=env, check=False,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}")
        return time.monotonic() - t0

    rows = []
    try:
        playbook("vm_start")  # creates the VM and its volume, first boot
        playbook("vm_stop")
        for _ in range(args.rounds):
            wall = playbook("vm_start")
            state = root / "state" / "vms" / "default_bench"
            boot = max(int(p.stem.split("-")[1]) for p in state.glob("boot-*.json"))
            spawned = json.loads((state / f"spawned-{boot}").read_text())
            ready = (state / f"ready-{boot}")
            ready_at = json.loads(ready.read_text()).get("readyAt") if ready.read_text().strip().startswith("{") \
                else None
            guest = (_ts(ready_at) if ready_at else ready.stat().st_mtime) - float(spawned["time"])
            stop_wall = playbook("vm_stop")
            shutdown = _shutdown_s(state, root / "log" / "default_bench.launcher.log", boot)
            rows.append((wall, guest, stop_wall, shutdown))
    finally:
        subprocess.run([str(VENV_BIN / "ansible-playbook"), "playbooks/vm_delete.yml", "-e", "owner=bench",
                        "-e", "delete_volume=true"], cwd=REPO, env=env, check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", config["netns"]], check=False, capture_output=True)
        shutil.rmtree(config["runtime_dir"], ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'round':>5} {'vm_start wall s':>16} {'guest boot s':>13} {'overhead s':>11} {'vm_stop wall s':>15} "
          f"{'guest shutdown s':>17} {'stop overhead s':>16}")
    for i, (wall, guest, stop_wall, shutdown) in enumerate(rows, 1):
        print(f"{i:>5} {wall:>16.2f} {guest:>13.2f} {wall - guest:>11.2f} {stop_wall:>15.2f} {shutdown:>17.2f} "
              f"{stop_wall - shutdown:>16.2f}")
    overhead = statistics.median(w - g for w, g, _, _ in rows)
    stop = statistics.median(s - d for _, _, s, d in rows)
    print(f"median control-plane overhead (absolute, load average {os.getloadavg()[0]:.1f}): vm_start "
          f"{overhead:.2f} s (goal <= 3 s: {'met' if overhead <= 3 else 'NOT met'}, {overhead / 3:.2f}x the goal); "
          f"vm_stop {stop:.2f} s (no goal; nan: the launcher left no stop time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
