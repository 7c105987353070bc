"""Moved to ``zjusct_localcluster.virtualnodes`` (localcluster/, docs/kubernetes.md): this name is the same module."""

import sys

from zjusct_localcluster import virtualnodes as _module

sys.modules[__name__] = _module
