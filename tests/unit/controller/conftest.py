"""Puts ``controller/`` on ``sys.path`` so the tests import ``zjusct_controller`` from this checkout."""

from __future__ import annotations

import sys
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[3] / "controller"
if str(CONTROLLER) not in sys.path:
    sys.path.insert(0, str(CONTROLLER))
