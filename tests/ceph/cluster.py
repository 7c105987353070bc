"""Moved to ``zjusct_localcluster.ceph`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import ceph as _module

sys.modules[__name__] = _module
