"""A Kubernetes cluster on one machine, built only from upstream software: the control plane (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler), real nodes (containerd + kubelet + kube-proxy +
kube-router's network policy controller, each node in its own network and mount namespace) and a Ceph cluster with
several OSDs that every node's Pods reach.

``hack/cluster.sh up|down|status|lose-node|restore-node`` (= ``python -m zjusct_localcluster``) is the operator's
tool; the tests use the same classes (``tests/cluster`` and ``tests/ceph`` re-export the control plane, the
single real node and the test Ceph from here). See docs/kubernetes.md and docs/testing-kubernetes.md.
"""
