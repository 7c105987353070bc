"""Test harness: a real single-node Ceph cluster (see cluster.py; CLI: ``python -m tests.ceph up|down``)."""

from .cluster import CephClusterError, Cluster, start_cluster, stop_cluster

__all__ = ["CephClusterError", "Cluster", "start_cluster", "stop_cluster"]
