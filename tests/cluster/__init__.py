"""A real Kubernetes control plane for integration tests (etcd + kube-apiserver +
kube-controller-manager + kube-scheduler on 127.0.0.1), usable from pytest fixtures and by hand
(``python -m tests.cluster up|down|status|lose-node|restore-node|node-up|node-down``), and a real node
(containerd + kubelet) that joins it.

See docs/testing-kubernetes.md.
"""

from ._binaries import Binaries, cache_root, pinned_versions
from ._cluster import (
    CONTROL_PLANE_WAIT,
    TENANT_NAMESPACE,
    TENANT_USER,
    Cluster,
    ClusterError,
    acquire_shared,
    load_state,
    release_shared,
    stop_state_dir,
    wait_for,
)
from ._nodes import BANDWIDTH_RESOURCE, DEFAULT_NODES, Heartbeat, Kubelet, NodeSpec
from ._realnode import RealNode, RealNodeError, archive_writer, node_images

__all__ = [
    "BANDWIDTH_RESOURCE",
    "CONTROL_PLANE_WAIT",
    "DEFAULT_NODES",
    "TENANT_NAMESPACE",
    "TENANT_USER",
    "Binaries",
    "Cluster",
    "ClusterError",
    "Heartbeat",
    "Kubelet",
    "NodeSpec",
    "RealNode",
    "RealNodeError",
    "acquire_shared",
    "archive_writer",
    "cache_root",
    "load_state",
    "node_images",
    "pinned_versions",
    "release_shared",
    "stop_state_dir",
    "wait_for",
]
