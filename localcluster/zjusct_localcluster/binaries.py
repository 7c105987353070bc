"""Locate the cached control-plane binaries built by ``hack/build-k8s.sh``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO / "hack" / "k8s" / "versions.env"
BUILD_SCRIPT = REPO / "hack" / "build-k8s.sh"


def cache_root() -> Path:
    """Return the cache root, ``$ZJUSCT_CACHE`` or ``/var/cache/zjusct-cloud``."""
    return Path(os.environ.get("ZJUSCT_CACHE", "/var/cache/zjusct-cloud"))


def pinned_versions() -> dict[str, str]:
    """Return ``{"K8S_VERSION": ..., "ETCD_VERSION": ..., "KUBE_ROUTER_VERSION": ...}`` from
    hack/k8s/versions.env, the environment overriding.

    Raises:
        OSError: the versions file cannot be read.
    """
    values: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    for key in ("K8S_VERSION", "ETCD_VERSION", "KUBE_ROUTER_VERSION"):
        if os.environ.get(key):
            values[key] = os.environ[key]
    return values


@dataclass(frozen=True)
class Binaries:
    """Paths of the four control-plane binaries of one pinned release plus kubelet (they may not exist yet).

    ``kubelet`` is only needed by a real node (:class:`~.node.RealNode`), ``kube_proxy`` and ``kube_router`` by
    the nodes of a :class:`~.cluster.LocalCluster`; :meth:`missing` covers the control plane only,
    :meth:`kubelet_missing_reason` the kubelet and :meth:`node_agents_missing_reason` the other two.
    """

    k8s_version: str
    etcd_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kube_proxy: Path
    kube_router: Path
    kube_router_version: str

    @classmethod
    def pinned(cls, cache: Path | None = None) -> Binaries:
        """Return the paths for the pinned versions under ``cache`` (default: :func:`cache_root`)."""
        root = cache or cache_root()
        versions = pinned_versions()
        k8s, etcd, router = versions["K8S_VERSION"], versions["ETCD_VERSION"], versions["KUBE_ROUTER_VERSION"]
        kdir = root / "k8s" / k8s
        return cls(
            k8s_version=k8s,
            etcd_version=etcd,
            etcd=root / "etcd" / etcd / "etcd",
            kube_apiserver=kdir / "kube-apiserver",
            kube_controller_manager=kdir / "kube-controller-manager",
            kube_scheduler=kdir / "kube-scheduler",
            kubelet=kdir / "kubelet",
            kube_proxy=kdir / "kube-proxy",
            kube_router=root / "kube-router" / router / "kube-router",
            kube_router_version=router,
        )

    def all(self) -> dict[str, Path]:
        """Return ``{component name: path}`` for the four binaries."""
        return {
            "etcd": self.etcd,
            "kube-apiserver": self.kube_apiserver,
            "kube-controller-manager": self.kube_controller_manager,
            "kube-scheduler": self.kube_scheduler,
        }

    def missing(self) -> list[str]:
        """Names of binaries that are not completely built (no executable or no ``.stamp`` file)."""
        return [
            name
            for name, path in self.all().items()
            if not (os.access(path, os.X_OK) and path.with_name(path.name + ".stamp").is_file())
        ]

    def missing_reason(self) -> str | None:
        """A human-readable reason when binaries are missing, else ``None``."""
        missing = self.missing()
        if not missing:
            return None
        return (
            f"{', '.join(missing)} not built for kubernetes v{self.k8s_version} / etcd v{self.etcd_version} "
            f"under {cache_root()}: run {BUILD_SCRIPT.relative_to(REPO)} (cold build takes minutes, then cached)"
        )

    def kubelet_missing_reason(self) -> str | None:
        """A human-readable reason when the kubelet binary is not completely built, else ``None``."""
        stamp = self.kubelet.with_name(self.kubelet.name + ".stamp")
        if os.access(self.kubelet, os.X_OK) and stamp.is_file():
            return None
        return (
            f"kubelet not built for kubernetes v{self.k8s_version} under {cache_root()}: "
            f"run {BUILD_SCRIPT.relative_to(REPO)} (builds only what is missing)"
        )

    def node_agents_missing_reason(self) -> str | None:
        """A human-readable reason when kube-proxy or kube-router is not completely built, else ``None``."""
        missing = [p.name for p in (self.kube_proxy, self.kube_router)
                   if not (os.access(p, os.X_OK) and p.with_name(p.name + ".stamp").is_file())]
        if not missing:
            return None
        return (f"{', '.join(missing)} not built (kubernetes v{self.k8s_version}, kube-router "
                f"v{self.kube_router_version}) under {cache_root()}: run {BUILD_SCRIPT.relative_to(REPO)}")

    def stamps(self) -> dict[str, dict[str, str]]:
        """Return the parsed ``key=value`` stamp files of the built binaries (missing ones omitted)."""
        out: dict[str, dict[str, str]] = {}
        for name, path in self.all().items():
            stamp = path.with_name(path.name + ".stamp")
            if stamp.is_file():
                out[name] = dict(line.split("=", 1) for line in stamp.read_text().splitlines() if "=" in line)
        return out
