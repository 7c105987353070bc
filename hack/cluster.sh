#!/usr/bin/env bash
# A Kubernetes cluster on this machine from upstream software only (docs/kubernetes.md): the control plane, N real
# nodes (containerd + kubelet + kube-proxy + kube-router, each in its own network and mount namespace) and Ceph.
#
#   eval "$(hack/cluster.sh up [--nodes N] [--no-ceph] [--build])"   # exports KUBECONFIG, CEPH_CONF, ZJUSCT_LOCALCLUSTER
#   hack/cluster.sh status
#   hack/cluster.sh lose-node node-2 [--how poweroff|agents|partition]
#   hack/cluster.sh restore-node node-2
#   hack/cluster.sh down
#
# Runs as root with the project's virtualenv ($ZJUSCT_CACHE/venv, made by hack/install-deps.sh); the code is
# localcluster/zjusct_localcluster of this checkout (python -m zjusct_localcluster --help).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ZJUSCT_CACHE:-/var/cache/zjusct-cloud}/venv
python=$venv/bin/python
[ -x "$python" ] || { echo "no virtualenv at $venv: run hack/install-deps.sh first" >&2; exit 1; }
export PYTHONPATH="$repo/localcluster${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m zjusct_localcluster "$@"
