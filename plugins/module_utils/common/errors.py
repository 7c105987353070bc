# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one root of the errors a module reports as its failure (docs/architecture.md, "A module's shape").

Every error class of plugins/module_utils that a module turns into a failed task derives from
:class:`CloudError` (keeping its other bases, e.g. ``ValueError`` or ``OSError``, where callers catch those);
:func:`common.module.run_module` catches it once and calls ``fail_json(msg=str(error), **error.failure())``.
"""

from __future__ import annotations

from typing import Any, Optional


class CloudError(Exception):
    """A request a module cannot carry out; the message names the option typed, the value and the rule.

    Attributes:
        field: the module option the failure is about (what the user typed), or None when it is not one option.
            Added to the failure result as ``field`` when set.
        details: further keys of the module's failure result beside ``msg`` (e.g. ``reason: QuotaExceeded``,
            ``errors``, ``running``); JSON-serialisable, never a secret.
    """

    field: Optional[str] = None

    def __init__(self, *args: Any, field: Optional[str] = None, **details: Any) -> None:
        super().__init__(*args)
        if field is not None:
            self.field = field
        self.details = details

    def failure(self) -> dict:
        """The failure result's keys beside ``msg``: :attr:`details`, plus ``field`` when set."""
        out = dict(getattr(self, "details", None) or {})
        if self.field is not None:
            out.setdefault("field", self.field)
        return out
