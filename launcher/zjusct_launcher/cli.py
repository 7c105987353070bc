"""Command line: ``run --config FILE``, ``check --config FILE``, ``version``, ``console --socket PATH``, ``gateway``.

Exit codes: run -> 0/1/2/3 (docs/launcher-protocol.md); check -> 0 valid, 2 invalid (every problem on stdout,
one per line), 1 hypervisor missing; version -> 0; console -> 0 after a session, 1 when the console cannot be opened;
gateway (the SSH gateway accounts' shell, :func:`console.gateway_main`) -> as console, 2 for a usage error.
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
    console_p = sub.add_parser("console", help="attach this terminal to a guest's serial console (detach: Ctrl-])")
    console_p.add_argument("--socket", required=True, help="the boot's serialConsole.socketPath")
    console_p.add_argument("--label", help="the VM's name in messages (default: the socket path)")
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["gateway"]:
        # sshd's "<shell> -c <command>": not argparse's to interpret (docs/security.md, the SSH gateway)
        from zjusct_launcher import console

        return console.gateway_main(args_list[1:])
    args = parser.parse_args(args_list)
    if args.command == "version":
        print(json.dumps({"version": __version__, "protocols": list(PROTOCOL_VERSIONS),
                          "config": {"apiVersion": API_VERSION, "kind": cfgmod.KIND},
                          "result": {"apiVersion": API_VERSION, "kind": "LauncherResult"}}))
        return 0
    if args.command == "check":
        return _check(args.config)
    if args.command == "console":
        from zjusct_launcher import console

        return console.attach(args.socket, args.label or args.socket)
    from zjusct_launcher.runner import run_file

    return run_file(args.config)


if __name__ == "__main__":
    sys.exit(main())
