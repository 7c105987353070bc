"""Moved to ``zjusct_localcluster.node`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import node as _module

sys.modules[__name__] = _module
