"""The test suite. Importing any ``tests.*`` module puts ``localcluster/`` (the one-machine cluster package,
``zjusct_localcluster``, which tests/cluster and tests/ceph re-export) on ``sys.path``, also for the
``python -m tests.cluster`` supervisors the fixtures spawn."""

import sys
from pathlib import Path

_LOCALCLUSTER = str(Path(__file__).resolve().parent.parent / "localcluster")
if _LOCALCLUSTER not in sys.path:
    sys.path.insert(0, _LOCALCLUSTER)
