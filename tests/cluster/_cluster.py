"""Moved to ``zjusct_localcluster.controlplane`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import controlplane as _module

sys.modules[__name__] = _module
