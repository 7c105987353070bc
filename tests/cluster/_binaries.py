"""Moved to ``zjusct_localcluster.binaries`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import binaries as _module

sys.modules[__name__] = _module
