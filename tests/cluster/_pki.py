"""Moved to ``zjusct_localcluster.pki`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import pki as _module

sys.modules[__name__] = _module
