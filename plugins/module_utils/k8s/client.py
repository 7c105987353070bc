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

import importlib.util
import json
import os
from typing import Any, Callable, Dict, Tuple

# Also ApiException (module __getattr__ below): callers catch the client's error type from here, also when the
# library is missing.
__all__ = ["HAS_K8S_CORE", "HAS_KUBERNETES", "REQUEST_TIMEOUT", "CoreException", "api_client", "api_missing",
           "api_refusal", "auth_argument_spec"]

# Only kubernetes.core's light modules are imported here. Its get_api_client and the kubernetes library (whose
# package import alone loads its config, dynamic and watch modules: 0.15-0.3 s) are imported when a Kubernetes
# client is needed, so the host backend's modules (cloudvm, cloudvm_info), which read auth_argument_spec only,
# start without them.
try:
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_MAP, AUTH_ARG_SPEC
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

    HAS_K8S_CORE = True
except ImportError:  # pragma: no cover - reported by api_client()
    HAS_K8S_CORE = False
    AUTH_ARG_MAP, AUTH_ARG_SPEC = {}, {}

    class CoreException(Exception):  # type: ignore[no-redef]
        """Placeholder when kubernetes.core is missing."""

HAS_KUBERNETES = importlib.util.find_spec("kubernetes") is not None

REQUEST_TIMEOUT = 30  # seconds, every Kubernetes API call of the modules (``_request_timeout``); the controller's
# own reconcile.REQUEST_TIMEOUT is the same value


def __getattr__(name: str) -> Any:
    """``ApiException`` on first use (PEP 562): importing it imports the kubernetes package."""
    if name != "ApiException":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from kubernetes.client.exceptions import ApiException as error_type
    except ImportError:  # pragma: no cover - reported by api_client()

        class error_type(Exception):  # type: ignore[no-redef]
            """Placeholder when the kubernetes library is missing."""

            status = 0
            reason = ""
            body = ""

        error_type.__name__ = error_type.__qualname__ = "ApiException"
    globals()["ApiException"] = error_type
    return error_type


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
    try:  # HAS_KUBERNETES says it is installed; a broken install (a dependency missing) shows here
        import kubernetes.client  # noqa: F401
    except ImportError as exc:
        raise error(f"the Python library 'kubernetes' does not import on the managed node: {exc}") from exc
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client

    try:
        k8s = get_api_client(**auth)
    except CoreException as exc:
        raise error(str(exc)) from exc
    except Exception as exc:  # unreachable server (discovery asks /version), bad context name ...
        what = "cannot reach the Kubernetes API" if "MaxRetryError" in type(exc).__name__ else \
            "cannot configure the API client"
        raise error(f"{what}: {type(exc).__name__}: {exc}") from exc
    return k8s.client.client


NO_SUCH_RESOURCE = "could not find the requested resource"  # a 404 Status for an unknown resource type


def api_missing(status: Any, body: Any) -> bool:
    """Whether an API error says the resource type itself is not served (its CRD is not installed), as opposed to
    one absent object. ``status`` is the HTTP code, ``body`` the decoded response body (None when it was not JSON).

    kube-apiserver answers a path it does not serve - an unregistered group or resource, as for a CRD that is not
    installed - with a plain-text ``404 page not found`` for get, list and create alike (measured on v1.31), and an
    absent object of a served resource with a ``Status`` of reason ``NotFound``; older servers answered the unknown
    type with a Status naming :data:`NO_SUCH_RESOURCE`.
    """
    if status != 404:
        return False
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return True
    return NO_SUCH_RESOURCE in str(body.get("message") or "")


def api_refusal(exc: Any, missing_hint: str = "") -> Tuple[str, Dict[str, Any]]:
    """The message and failure details of an API server's refusal: the one reading of its ``Status`` body.

    Args:
        exc: the ``kubernetes.client`` ApiException (its ``status``, ``reason`` and ``body``).
        missing_hint: how to install the API, appended as ``; <missing_hint>`` when the 404 says the resource type
            itself is not served (:func:`api_missing`), not that one object is absent.

    Returns:
        ``(message, details)``. ``message`` is the Status ``message`` verbatim (for CEL and schema refusals it
        already names the field path: ``spec.owner: Forbidden: is immutable (was alice, requested bob)``), else
        ``HTTP <code> <reason>``. ``details``: ``api_status`` (the HTTP code), ``api_reason`` (the Status reason
        such as Invalid, Forbidden, NotFound, else the HTTP reason), ``field_errors`` (``[{field, message}]`` of the
        Status ``details.causes``) and ``api_missing`` (True: the API itself is not served).
    """
    status = getattr(exc, "status", None)
    message, reason, causes = "", getattr(exc, "reason", "") or "", []
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict):
        message = body.get("message") or ""
        reason = body.get("reason") or reason
        for cause in (body.get("details") or {}).get("causes") or []:
            causes.append({"field": cause.get("field", ""), "message": cause.get("message", "")})
    if not message:
        message = f"HTTP {status} {reason}".strip()
    missing = api_missing(status, body)
    if missing and missing_hint:
        message += f"; {missing_hint}"
    return message, {"api_status": status, "api_reason": reason, "field_errors": causes, "api_missing": missing}
