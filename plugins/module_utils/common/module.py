# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one entry shape of every module in plugins/modules (docs/architecture.md, "A module's shape").

A module file holds DOCUMENTATION, EXAMPLES, RETURN, its ``ARGUMENT_SPEC`` (or a spec builder imported from
module_utils where modules share options) and a ``main()`` of two statements::

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_<module name>)

``run_<module name>(params, check_mode[, diff]) -> dict`` lives in module_utils and does the work; it raises
:class:`common.errors.CloudError` (or a subclass) for every failure it reports.
"""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError


def run_module(module: Any, run: Callable[..., dict], diff: bool = False) -> None:
    """Call ``run(module.params, module.check_mode)`` (plus ``module._diff`` when ``diff``) and end the module.

    The result's ``warnings`` (a list of str, optional) become ``module.warn`` calls; the rest is
    ``exit_json(**result)``. A :class:`CloudError` becomes ``fail_json(msg=str(error), **error.failure())``;
    any other exception is a bug and keeps its traceback.
    """
    try:
        if diff:
            result = run(module.params, module.check_mode, module._diff)
        else:
            result = run(module.params, module.check_mode)
    except CloudError as exc:
        module.fail_json(msg=str(exc), **exc.failure())
    for warning in result.pop("warnings", None) or []:
        module.warn(warning)
    module.exit_json(**result)
