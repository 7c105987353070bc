"""Writes the API server refuses for good: which answers are refusals and what the status then says
(:func:`api_refusal`), the status reasons they leave (:data:`REFUSAL_REASONS`), and how long a refused or failed VM
waits before its next reconcile (:func:`retry_delay`). Pure: :mod:`.reconcile` catches the answers, and
:func:`.decide.refuse` turns a plan into the refused one.
"""

from __future__ import annotations

import json
import re
from typing import Optional

QUOTA_EXCEEDED = "QuotaExceeded"
REFUSED = "Refused"
REFUSAL_REASONS = (QUOTA_EXCEEDED, REFUSED)  # status reasons of a write the API server (or the quota) refused
REFUSAL_CODES = (400, 403, 422)  # BadRequest, Forbidden (quota, LimitRange, admission, RBAC), Invalid
# kube-apiserver's own wording (k8s.io/apiserver .../admission/plugin/resourcequota/controller.go and
# plugin/pkg/admission/limitranger/admission.go): the namespace's ResourceQuota or LimitRange refused the object
_QUOTA_WORDS = re.compile(r"exceeded quota: |failed quota: |(minimum|maximum) \S+ usage per \S+ is |"
                          r"max limit to request ratio per ")
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0


def api_refusal(code: Optional[int], body: Optional[str], what: str) -> Optional[tuple[str, str]]:
    """``(reason, message)`` for a write the API server refused for good (HTTP 400, 403 or 422), None otherwise
    (conflicts, 404, throttling, server errors and lost connections are retried as they are).

    ``reason`` is :data:`QUOTA_EXCEEDED` when the namespace's ResourceQuota or LimitRange refused (the API
    server's wording, ``exceeded quota: ...``, ``minimum memory usage per Container is ...``), else :data:`REFUSED`
    (an admission policy or webhook, Pod Security, RBAC, an invalid object). ``message`` names ``what`` was
    written, the HTTP code and the API server's own message (its Status ``message``, else the body).
    """
    if code not in REFUSAL_CODES:
        return None
    text = ""
    try:
        doc = json.loads(body or "")
        if isinstance(doc, dict):
            text = str(doc.get("message") or "")
    except ValueError:
        pass
    text = text or (body or "").strip() or "no message"
    reason = QUOTA_EXCEEDED if code == 403 and _QUOTA_WORDS.search(text) else REFUSED
    return reason, f"the API server refused {what} (HTTP {code}): {text}"


def retry_delay(attempt: int) -> float:
    """Seconds before retrying a VM whose last reconcile was refused or failed, after ``attempt`` such
    reconciles in a row (1, 2, ...): 2, 4, 8, ... up to 60 s, as client-go's per-item exponential backoff."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, int(attempt) - 1))
