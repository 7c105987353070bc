# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.fc_launcher``: one launcher instance (one boot of one VM, under QEMU or Firecracker;
the module's name is older than QEMU support) on a host."""

from __future__ import annotations

import dataclasses
import shutil

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import dns_label_problem


def run_fc_launcher(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.fc_launcher`` module: carry out ``state`` for one VM's launcher.

    Returns:
        The module result: ``changed``, ``running``, ``boot_id``, ``observation``, ``pid`` while running.

    Raises:
        CloudError: a name that is not a DNS label (``field`` the option), an unreadable host configuration,
            another boot still running or a launcher that outlived ``wait_timeout`` (both with ``running``,
            ``boot_id``); LauncherError: the launcher could not be started.
    """
    for field in ("name", "namespace"):
        problem = dns_label_problem(field, params[field])
        if problem:
            raise CloudError(problem, field=field)
    try:
        cfg = load(params.get("host_config"))
    except (OSError, ValueError) as exc:
        raise CloudError(str(exc)) from exc
    ns, name = params["namespace"], params["name"]
    paths = cfg.launcher_paths(ns, name)
    live = sup.running_boot(paths)
    state = params["state"]
    if state == "started":
        boot = int(params["boot_id"])
        if live is not None and live[0] != boot:
            raise CloudError(f"boot {live[0]} of {ns}/{name} is still running (pid {live[1]}); stop it before"
                             f" starting boot {boot}", running=True, boot_id=live[0])
        obs = sup.observe(paths, boot, cfg.node)
        if live is not None or obs.state in ("exited", "lost") or \
                (obs.state == "starting" and "not spawned" not in obs.detail):
            return _report(paths, boot, changed=False)
        if check_mode:
            return {"changed": True, "running": False, "boot_id": boot, "observation": {"state": "absent"}}
        config = dict(params["config"])
        config["vm"] = dict(config.get("vm") or {}, namespace=ns, name=name, bootID=boot)
        config.update(runtimeDir=paths.runtime_dir, serialLogPath=paths.serial_log,
                      readyMarkerPath=paths.ready(boot),
                      result=dict(config.get("result") or {}, path=paths.result(boot)))
        try:
            sup.start(paths, config, list(cfg.launcher_command), sup.launcher_env(cfg.launcher_pythonpath),
                      cfg.netns)
        except OSError as exc:
            raise CloudError(str(exc)) from exc
        return _report(paths, boot, changed=True)
    # stopped / absent
    changed = live is not None
    if check_mode:
        return {"changed": changed or (state == "absent" and bool(sup.boots(paths))), "running": live is not None,
                "boot_id": live[0] if live else params.get("boot_id"), "observation": {}}
    if live is not None:
        sup.request_stop(paths)
        if not sup.wait_gone(paths, float(params["wait_timeout"])):
            raise CloudError(f"launcher of {ns}/{name} (boot {live[0]}) still alive after {params['wait_timeout']} s",
                             running=True, boot_id=live[0])
    boot_ids = sup.boots(paths)
    result = _report(paths, live[0] if live else (boot_ids[-1] if boot_ids else params.get("boot_id") or 0),
                     changed=changed)
    if state == "absent" and boot_ids:
        shutil.rmtree(paths.state_dir, ignore_errors=True)
        shutil.rmtree(paths.runtime_dir, ignore_errors=True)
        result["changed"] = True
    return result


def _report(paths: sup.LauncherPaths, boot: int, changed: bool) -> dict:
    live = sup.running_boot(paths)
    obs = sup.observe(paths, boot)
    out = {"changed": changed, "running": live is not None, "boot_id": boot,
           "observation": {k: v for k, v in dataclasses.asdict(obs).items() if v not in (None, "")}}
    if live is not None:
        out["pid"] = live[1]
    return out
