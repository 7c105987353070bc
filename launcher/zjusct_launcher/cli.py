"""Command line: ``run --config FILE``, ``check --config FILE``, ``version``.

Exit codes: run -> 0/1/2/3 (docs/launcher-protocol.md); check -> 0 valid, 2 invalid (every problem on stdout,
one per line), 1 hypervisor missing; version -> 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from zjusct_launcher import API_VERSION, PROTOCOL_VERSIONS, __version__, capability, environment
from zjusct_launcher import config as cfgmod


def _check(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError) as exc:
        print(f"{path}: cannot read the config as JSON: {exc}")
        return 2
    try:
        cfg = cfgmod.parse(doc)
        problems = environment.environment_problems(cfg)
    except cfgmod.ConfigError as exc:
        problems = exc.problems
        cfg = None
    if problems:
        for p in problems:
            print(p)
        print(f"{len(problems)} problem(s): config invalid (ConfigInvalid)")
        return 2
    assert cfg is not None
    default = capability.profile(cfg.hypervisor.type).default_binary
    binary = cfg.hypervisor.binary or shutil.which(default)
    if not binary or not os.access(binary, os.X_OK):
        print(f"hypervisor.binary: {cfg.hypervisor.binary or default} is not installed or not executable "
              "(HypervisorMissing)")
        return 1
    print(f"config valid: {cfg.vm.namespace}/{cfg.vm.name} bootID {cfg.vm.boot_id}, {cfg.hypervisor.type} "
          f"at {binary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zjusct-launcher",
                                     description="Run one boot of one VM (protocol " + API_VERSION + ").")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run the VM described by the config until it ends; write the result")
    run_p.add_argument("--config", required=True, help="LauncherConfig v1 JSON file")
    check_p = sub.add_parser("check", help="validate the config; list every problem; start nothing")
    check_p.add_argument("--config", required=True, help="LauncherConfig v1 JSON file")
    sub.add_parser("version", help="print the launcher version and the protocol versions it speaks (JSON)")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(json.dumps({"version": __version__, "protocols": list(PROTOCOL_VERSIONS),
                          "config": {"apiVersion": API_VERSION, "kind": cfgmod.KIND},
                          "result": {"apiVersion": API_VERSION, "kind": "LauncherResult"}}))
        return 0
    if args.command == "check":
        return _check(args.config)
    from zjusct_launcher.runner import run_file

    return run_file(args.config)


if __name__ == "__main__":
    sys.exit(main())
