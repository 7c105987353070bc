"""Files the launcher keeps in ``runtimeDir`` (created 0700). All but ``launcher.lock`` are removed at exit."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimePaths:
    runtime_dir: str

    def _p(self, name: str) -> str:
        return os.path.join(self.runtime_dir, name)

    @property
    def lock(self) -> str:
        return self._p("launcher.lock")

    @property
    def launcher_pid(self) -> str:
        return self._p("launcher.pid")

    @property
    def vmm_pid(self) -> str:
        return self._p("vmm.pid")

    @property
    def qmp_socket(self) -> str:
        return self._p("qmp.sock")

    @property
    def fc_socket(self) -> str:
        return self._p("firecracker.sock")

    @property
    def fc_config(self) -> str:
        return self._p("firecracker.json")

    @property
    def identity_disk(self) -> str:
        return self._p("identity.tar")

    @property
    def rbd_secret(self) -> str:
        return self._p("rbd.secret")

    def transient(self) -> tuple[str, ...]:
        """Everything removed on exit (and removed as stale on start, under the lock)."""
        return (self.launcher_pid, self.vmm_pid, self.qmp_socket, self.fc_socket, self.fc_config,
                self.identity_disk, self.rbd_secret)
