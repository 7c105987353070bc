"""LauncherResult v1: reasons, exit codes and the document (pure; :func:`fs.publish` writes it).

The result is the only thing a supervisor needs to tell "ended with a result" from "vanished".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from zjusct_launcher import API_VERSION

KIND = "LauncherResult"

# reason -> process exit code (notes/CONTRACT-guest.md: 0 = ended as asked or the guest shut down).
EXIT_CODES = {
    "GuestShutdown": 0,
    "GuestReboot": 0,
    "StopRequested": 0,
    "StopTimeoutKilled": 1,
    "HypervisorCrashed": 1,
    "GuestPanic": 1,
    "ReadinessTimeout": 1,
    "HypervisorMissing": 1,
    "LauncherError": 1,
    "ConfigInvalid": 2,
}
REASONS = tuple(EXIT_CODES)
EXIT_ALREADY_RUNNING = 3


@dataclass
class Result:
    vm: dict[str, Any]
    boot_id: int
    reason: str
    started_at: str
    finished_at: str
    message: str
    hypervisor_exit_status: int | None = None
    ready_at: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def as_json(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "vm": self.vm,
            "bootID": self.boot_id,
            "reason": self.reason,
            "exitCode": self.exit_code,
            "hypervisorExitStatus": self.hypervisor_exit_status,
            "startedAt": self.started_at,
            "readyAt": self.ready_at,
            "finishedAt": self.finished_at,
            "message": self.message,
        }


def encode(result: Result) -> bytes:
    """The result file's bytes: the document as indented JSON and a newline."""
    return (json.dumps(result.as_json(), indent=2, sort_keys=False) + "\n").encode()


def encode_termination_message(result: Result) -> bytes:
    """The termination message's bytes: the document as compact JSON, cut to the 4096 bytes Kubernetes reads."""
    return json.dumps(result.as_json(), separators=(",", ":")).encode()[:4096]
