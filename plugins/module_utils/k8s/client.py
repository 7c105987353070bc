# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API client of every module of this collection, built the way kubernetes.core builds its own.

Connection options (``kubeconfig``, ``context``, ``host``, ``api_key``, ... with their ``K8S_AUTH_*``
environment fallbacks), their argument spec and client caching come from kubernetes.core
(``module_utils.args_common.AUTH_ARG_SPEC``, ``module_utils.k8s.client.get_api_client``), so a playbook
connects our modules exactly as it connects ``kubernetes.core.k8s``. Both libraries are optional on the
managed node: importing this module never fails, and :func:`api_client` names what is missing.
"""

from __future__ import annotations

import os
from typing import Any, Callable

# ApiException is re-exported: callers catch the client's error type from here, also when the library is missing
__all__ = ["HAS_K8S_CORE", "HAS_KUBERNETES", "ApiException", "CoreException", "api_client", "auth_argument_spec"]

try:
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_MAP, AUTH_ARG_SPEC
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

    HAS_K8S_CORE = True
except ImportError:  # pragma: no cover - reported by api_client()
    HAS_K8S_CORE = False
    AUTH_ARG_MAP, AUTH_ARG_SPEC = {}, {}

    class CoreException(Exception):  # type: ignore[no-redef]
        """Placeholder when kubernetes.core is missing."""

try:
    from kubernetes.client.exceptions import ApiException

    HAS_KUBERNETES = True
except ImportError:  # pragma: no cover - reported by api_client()
    HAS_KUBERNETES = False

    class ApiException(Exception):  # type: ignore[no-redef]
        """Placeholder when the kubernetes library is missing."""

        status = 0
        reason = ""
        body = ""


def auth_argument_spec() -> dict:
    """kubernetes.core's connection options (a copy; empty when kubernetes.core is missing)."""
    return {k: dict(v) for k, v in AUTH_ARG_SPEC.items()}


def api_client(params: dict, error: Callable[[str], Exception]) -> Any:
    """A ``kubernetes.client.ApiClient`` authenticated from the module's connection options (then K8S_AUTH_*).

    Args:
        params: the module's parameters (those of :func:`auth_argument_spec` are read).
        error: builds the exception to raise from a one-line message (the calling module's own error type).

    Raises:
        the exception built by ``error``: a library is missing, the named kubeconfig does not exist, or the
        client cannot be set up (unreachable server, unknown context...).
    """
    if not HAS_KUBERNETES:
        raise error("the Python library 'kubernetes' is not installed on the managed node")
    if not HAS_K8S_CORE:
        raise error("the collection kubernetes.core is not installed")
    auth = {option: params.get(option) for option in AUTH_ARG_MAP.values() if params.get(option) is not None}
    for option in ("impersonate_user", "impersonate_groups"):
        if params.get(option):
            auth[option] = params[option]
    kubeconfig = auth.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG")
    if isinstance(kubeconfig, str) and not os.path.exists(os.path.expanduser(kubeconfig)):
        raise error(f"kubeconfig: {kubeconfig} does not exist")
    try:
        k8s = get_api_client(**auth)
    except CoreException as exc:
        raise error(str(exc)) from exc
    except Exception as exc:  # unreachable server (discovery asks /version), bad context name ...
        what = "cannot reach the Kubernetes API" if "MaxRetryError" in type(exc).__name__ else \
            "cannot configure the API client"
        raise error(f"{what}: {type(exc).__name__}: {exc}") from exc
    return k8s.client.client
