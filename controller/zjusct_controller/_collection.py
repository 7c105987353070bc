"""Make ``ansible_collections.zjusct.cloud`` importable from a checkout (``<repo>/.collections``).

Installed collections (``ansible-galaxy collection install``) or a ``PYTHONPATH`` that already provides it win;
otherwise the checkout's ``.collections`` directory (created by ``hack/setup-collection.sh``) is appended to
``sys.path``. Raises ImportError naming both places when neither provides it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2] / ".collections"


def _importable() -> bool:
    try:
        return importlib.util.find_spec("ansible_collections.zjusct.cloud.plugins.module_utils") is not None
    except ModuleNotFoundError:
        return False


if not _importable():
    if (_CHECKOUT / "ansible_collections" / "zjusct" / "cloud").exists() and str(_CHECKOUT) not in sys.path:
        sys.path.append(str(_CHECKOUT))
    if not _importable():
        raise ImportError(f"ansible_collections.zjusct.cloud is not importable: install the collection or run"
                          f" hack/setup-collection.sh (expected {_CHECKOUT})")
