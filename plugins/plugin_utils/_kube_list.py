# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paginated, read-only listing of CloudVMs from kube-apiserver for the inventory plugin.

Why not always the ``kubernetes`` Python client: importing ``kubernetes.client`` loads hundreds
of generated model classes and costs more than the list itself for a few thousand VMs (measured
in bench/inventory_scale.py). The common credentials — a kubeconfig with a token, token file,
client certificate or basic auth, explicit ``host`` + ``api_key`` / client certificate, or the
in-cluster service account — are therefore resolved here and the list runs over ``http.client``
(stdlib). Everything else (``exec`` and ``auth-provider`` users, proxies, ``tls-server-name``,
``persist_config``) goes through kubernetes.core's ``get_api_client``, the same client the
cloudvm modules use, so every kubernetes.core connection option keeps working.

The options and their precedence follow kubernetes.core (``module_utils/k8s/client.py``):
``host`` with ``api_key``, client certificate or username/password needs no kubeconfig; otherwise
``kubeconfig``/``context`` select a kubeconfig; with neither, the in-cluster service account is
tried, then ``$KUBECONFIG`` or ``~/.kube/config``. Explicit options then override what the
kubeconfig says. Environment fallbacks (``K8S_AUTH_*``) are resolved by the plugin's option
definitions before :func:`resolve` is called.

Listing: one paginated request sequence (``limit`` + ``continue``, as ``kubectl get`` does) per
namespace, or one cluster-wide when no namespace is given; never one request per VM. The launcher Pods of
Running VMs are listed the same way (:func:`pod_list_path`), never one request per Pod.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import ssl
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path, not a secret)
IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
AUTH_OPTIONS = ("kubeconfig", "context", "host", "api_key", "username", "password", "validate_certs", "ca_cert",
                "client_cert", "client_key", "proxy", "no_proxy", "proxy_headers", "persist_config",
                "impersonate_user", "impersonate_groups")
# Options that only the full client handles.
_FULL_CLIENT_OPTIONS = ("proxy", "proxy_headers", "persist_config")

GetJson = Callable[[str, dict], dict]


class KubeListError(Exception):
    """Listing failed; the message says what, where and what to do (never a credential). ``status`` is the HTTP
    status of an answer that refused the list (None when there was none: unreachable, not JSON...)."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Connection:
    """How to reach and authenticate to kube-apiserver (resolved, ready for http.client).

    ``ca_data`` / ``client_cert_data`` / ``client_key_data`` are PEM text. ``token`` is a bearer
    token, ``basic`` a ``user:password`` pair. ``needs_full_client`` means the credentials need the
    kubernetes client (exec plugin, auth provider, proxy...): use :func:`full_client_get_json`.
    """

    server: str = ""
    verify: bool = True
    ca_file: Optional[str] = None
    ca_data: Optional[str] = None
    client_cert_file: Optional[str] = None
    client_key_file: Optional[str] = None
    client_cert_data: Optional[str] = None
    client_key_data: Optional[str] = None
    token: Optional[str] = field(default=None, repr=False)
    basic: Optional[str] = field(default=None, repr=False)
    impersonate_user: Optional[str] = None
    impersonate_groups: tuple[str, ...] = ()
    needs_full_client: bool = False
    why_full_client: str = ""
    # the kubeconfig context and user entry this came from (canonical JSON; may hold a secret, only
    # ever hashed by identity_fingerprint)
    kubeconfig_user: str = field(default="", repr=False)


# --------------------------------------------------------------------------- kubeconfig


def _yaml_load(text: str, where: str) -> Any:
    import yaml  # PyYAML ships with ansible-core

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeListError(f"kubeconfig: {where} is not valid YAML: {exc}") from exc


def _default_kubeconfig_paths(env: dict) -> list[str]:
    if env.get("KUBECONFIG"):
        return [p for p in env["KUBECONFIG"].split(os.pathsep) if p]
    return [os.path.join(os.path.expanduser("~"), ".kube", "config")]


def _named(entries: Any, key: str) -> dict:
    out: dict = {}
    for item in entries or []:
        if isinstance(item, dict) and item.get("name") is not None and item["name"] not in out:
            out[item["name"]] = item.get(key) or {}
    return out


def load_kubeconfig(kubeconfig: Any, env: dict) -> tuple[dict, dict, dict, str]:
    """Read and merge kubeconfig files (first file wins per name, as kubectl merges them).

    Args:
        kubeconfig: a path, several paths joined with ``os.pathsep``, a dict (in-memory config), or
            None for ``$KUBECONFIG`` / ``~/.kube/config``.
        env: the environment (``KUBECONFIG``).

    Returns:
        ``(clusters, users, contexts, current_context)`` keyed by name; relative file paths in a
        file's clusters and users are made absolute against that file's directory.

    Raises:
        KubeListError: a named file is missing or not YAML, or nothing usable was found.
    """
    docs: list[tuple[dict, str]] = []
    if isinstance(kubeconfig, dict):
        docs.append((kubeconfig, ""))
    else:
        paths = [p for p in str(kubeconfig).split(os.pathsep) if p] if kubeconfig else _default_kubeconfig_paths(env)
        for path in paths:
            path = os.path.expanduser(path)
            if not os.path.exists(path):
                if kubeconfig:
                    raise KubeListError(f"kubeconfig: {path} does not exist")
                continue
            try:
                with open(path, encoding="utf-8") as fh:
                    doc = _yaml_load(fh.read(), path)
            except OSError as exc:
                raise KubeListError(f"kubeconfig: cannot read {path}: {exc}") from exc
            if not isinstance(doc, dict):
                raise KubeListError(f"kubeconfig: {path} is not a kubeconfig (expected a mapping with clusters, "
                                    f"users and contexts)")
            docs.append((doc, os.path.dirname(os.path.abspath(path))))
        if not docs:
            raise KubeListError(f"kubeconfig: none of {', '.join(paths)} exists; set kubeconfig, host or the "
                                f"K8S_AUTH_* variables")
    clusters: dict = {}
    users: dict = {}
    contexts: dict = {}
    current = ""
    for doc, base in docs:
        for name, cluster in _named(doc.get("clusters"), "cluster").items():
            clusters.setdefault(name, _absolute(cluster, base, ("certificate-authority",)))
        for name, user in _named(doc.get("users"), "user").items():
            users.setdefault(name, _absolute(user, base, ("client-certificate", "client-key", "tokenFile")))
        for name, ctx in _named(doc.get("contexts"), "context").items():
            contexts.setdefault(name, ctx)
        current = current or doc.get("current-context") or ""
    return clusters, users, contexts, current


def _absolute(entry: dict, base: str, keys: Iterable[str]) -> dict:
    out = dict(entry)
    for key in keys:
        if out.get(key) and base and not os.path.isabs(out[key]):
            out[key] = os.path.join(base, out[key])
    return out


def _from_kubeconfig(auth: dict, env: dict) -> Connection:
    clusters, users, contexts, current = load_kubeconfig(auth.get("kubeconfig"), env)
    name = auth.get("context") or current
    if not name:
        raise KubeListError("kubeconfig: no context given and no current-context set; "
                            f"contexts: {', '.join(sorted(contexts)) or 'none'}")
    if name not in contexts:
        raise KubeListError(f"context: {name!r} is not in the kubeconfig; contexts: "
                            f"{', '.join(sorted(contexts)) or 'none'}")
    ctx = contexts[name]
    cluster = clusters.get(ctx.get("cluster"))
    if cluster is None or not cluster.get("server"):
        raise KubeListError(f"kubeconfig: context {name!r} names cluster {ctx.get('cluster')!r}, which is missing "
                            f"or has no server")
    user = users.get(ctx.get("user"), {}) if ctx.get("user") else {}
    why = ""
    if user.get("exec"):
        why = "the kubeconfig user uses an exec credential plugin"
    elif user.get("auth-provider"):
        why = "the kubeconfig user uses an auth-provider"
    elif cluster.get("tls-server-name") or cluster.get("proxy-url"):
        why = "the kubeconfig cluster sets tls-server-name or proxy-url"
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _read(user["tokenFile"], "kubeconfig tokenFile").strip()
    basic = f"{user['username']}:{user.get('password', '')}" if user.get("username") else None
    return Connection(
        server=cluster["server"],
        verify=not cluster.get("insecure-skip-tls-verify", False),
        ca_file=cluster.get("certificate-authority"),
        ca_data=_b64(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        client_cert_file=user.get("client-certificate"),
        client_key_file=user.get("client-key"),
        client_cert_data=_b64(user.get("client-certificate-data"), "client-certificate-data"),
        client_key_data=_b64(user.get("client-key-data"), "client-key-data"),
        token=token, basic=basic,
        impersonate_user=user.get("as"), impersonate_groups=tuple(user.get("as-groups") or ()),
        needs_full_client=bool(why), why_full_client=why,
        kubeconfig_user=json.dumps({"context": name, "user": user}, sort_keys=True, default=str))


def _b64(value: Optional[str], what: str) -> Optional[str]:
    if not value:
        return None
    try:
        return base64.b64decode(value).decode("ascii")
    except (ValueError, UnicodeDecodeError) as exc:
        raise KubeListError(f"kubeconfig: {what} is not base64-encoded PEM") from exc


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise KubeListError(f"{what}: cannot read {path}: {exc.strerror}") from exc


def resolve(auth: dict, env: Optional[dict] = None) -> Connection:
    """Resolve connection options (kubernetes.core names, already merged with ``K8S_AUTH_*``).

    Args:
        auth: option name → value for the names in :data:`AUTH_OPTIONS` (None = unset).
        env: the process environment (default ``os.environ``).

    Returns:
        The resolved :class:`Connection` (``needs_full_client`` set when only the kubernetes
        client can authenticate).

    Raises:
        KubeListError: the kubeconfig or a credential file is missing or invalid.
    """
    env = dict(os.environ if env is None else env)
    a = {k: v for k, v in auth.items() if v is not None and v != ""}
    host = str(a["host"]).rstrip("/") if a.get("host") else None
    explicit = bool(host) and bool(
        a.get("api_key") or (a.get("client_cert") and a.get("client_key")) or (a.get("username") and a.get("password")))
    if explicit:
        conn = Connection(server=host or "")
    elif a.get("kubeconfig") or a.get("context"):
        conn = _from_kubeconfig(a, env)
    elif env.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN):
        svc_host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in svc_host:
            svc_host = f"[{svc_host}]"
        conn = Connection(server=f"https://{svc_host}:{port}", ca_file=IN_CLUSTER_CA,
                          token=_read(IN_CLUSTER_TOKEN, "in-cluster service account token").strip())
    else:
        conn = _from_kubeconfig(a, env)
    over: dict = {}
    if host:
        over["server"] = host
    if a.get("api_key"):
        over.update(token=str(a["api_key"]), basic=None)
    if a.get("username") and a.get("password"):
        over.update(basic=f"{a['username']}:{a['password']}", token=None)
    if a.get("ca_cert"):
        over.update(ca_file=a["ca_cert"], ca_data=None)
    if a.get("client_cert"):
        over.update(client_cert_file=a["client_cert"], client_cert_data=None)
    if a.get("client_key"):
        over.update(client_key_file=a["client_key"], client_key_data=None)
    if a.get("validate_certs") is not None:
        over["verify"] = bool(a["validate_certs"])
    if a.get("impersonate_user"):
        over["impersonate_user"] = a["impersonate_user"]
    if a.get("impersonate_groups"):
        groups = a["impersonate_groups"]
        over["impersonate_groups"] = tuple(groups.split(",") if isinstance(groups, str) else groups)
    full = [o for o in _FULL_CLIENT_OPTIONS if a.get(o)]
    if full:
        over.update(needs_full_client=True, why_full_client=f"option {', '.join(full)} is set")
    if not over:
        return conn
    from dataclasses import replace

    return replace(conn, **over)


def identity_fingerprint(conn: Connection) -> str:
    """A one-way fingerprint of who ``conn`` authenticates as (for cache keys; never the secret).

    The SHA-256 (first 16 hex digits) over the bearer token, the basic-auth pair, the client
    certificate (PEM text, read from its file when given as a path), the impersonated user and
    groups and, for kubeconfig credentials, the context name and the whole user entry (which names
    an exec plugin's command, arguments and environment). Two identities that differ in any of
    these get different fingerprints; the digest cannot be turned back into the token.

    Raises:
        KubeListError: the client certificate file cannot be read.
    """
    cert = conn.client_cert_data
    if cert is None and conn.client_cert_file:
        cert = _read(conn.client_cert_file, "client_cert")
    material = json.dumps({"token": conn.token, "basic": conn.basic, "client_cert": cert,
                           "impersonate_user": conn.impersonate_user,
                           "impersonate_groups": list(conn.impersonate_groups),
                           "kubeconfig_user": conn.kubeconfig_user}, sort_keys=True)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------- transports


def _ssl_context(conn: Connection) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if not conn.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        try:
            if conn.ca_file:
                ctx.load_verify_locations(cafile=conn.ca_file)
            if conn.ca_data:
                ctx.load_verify_locations(cadata=conn.ca_data)
        except (OSError, ssl.SSLError) as exc:
            raise KubeListError(f"ca_cert: cannot load the CA certificate: {exc}") from exc
    cert, key = conn.client_cert_file, conn.client_key_file
    if conn.client_cert_data or conn.client_key_data:
        # ssl can only load a client key pair from files: write them to a private directory that is
        # removed as soon as the context holds them.
        with tempfile.TemporaryDirectory(prefix="zjusct-inv-") as tmp:
            if conn.client_cert_data:
                cert = os.path.join(tmp, "client.crt")
                _write_private(cert, conn.client_cert_data)
            if conn.client_key_data:
                key = os.path.join(tmp, "client.key")
                _write_private(key, conn.client_key_data)
            _load_chain(ctx, cert, key)
    else:
        _load_chain(ctx, cert, key)
    return ctx


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text)


def _load_chain(ctx: ssl.SSLContext, cert: Optional[str], key: Optional[str]) -> None:
    if not cert:
        return
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise KubeListError(f"client_cert/client_key: cannot load the client certificate {cert}: {exc}") from exc


def _status_message(status: int, body: bytes) -> str:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        doc = {}
    message = doc.get("message") if isinstance(doc, dict) else None
    return message or f"HTTP {status}"


def http_get_json(conn: Connection, timeout: float) -> GetJson:
    """A ``get_json(path, query)`` over one keep-alive http.client connection.

    Raises (from the returned function):
        KubeListError: connection, TLS or HTTP errors; 410 raises :class:`Expired`.
    """
    parsed = urllib.parse.urlsplit(conn.server)
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        raise KubeListError(f"host: {conn.server!r} is not an http(s) URL")
    base = parsed.path.rstrip("/")
    headers = {"Accept": "application/json", "User-Agent": "zjusct.cloud.cloudvm-inventory"}
    if conn.token:
        headers["Authorization"] = f"Bearer {conn.token}"
    elif conn.basic:
        headers["Authorization"] = "Basic " + base64.b64encode(conn.basic.encode()).decode()
    if conn.impersonate_user:
        headers["Impersonate-User"] = conn.impersonate_user
    if parsed.scheme == "https":
        ctx = _ssl_context(conn)
        client: http.client.HTTPConnection = http.client.HTTPSConnection(
            parsed.hostname, parsed.port or 443, context=ctx, timeout=timeout)
    else:
        client = http.client.HTTPConnection(parsed.hostname, parsed.port or 80, timeout=timeout)

    def get_json(path: str, query: dict) -> dict:
        url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        try:
            client.putrequest("GET", url)
            for key, value in headers.items():
                client.putheader(key, value)
            for group in conn.impersonate_groups:
                client.putheader("Impersonate-Group", group)
            client.endheaders()
            resp = client.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            client.close()
            raise KubeListError(f"cannot reach the Kubernetes API at {conn.server}: {exc}") from exc
        if resp.status == 410:
            raise Expired(_status_message(resp.status, body))
        if resp.status >= 400:
            raise http_error(resp.status, _status_message(resp.status, body), conn.server, path)
        try:
            return dict(json.loads(body))
        except ValueError as exc:
            raise KubeListError(f"{conn.server}{path}: the answer is not JSON: {exc}") from exc

    return get_json


def full_client_get_json(auth: dict, timeout: float) -> GetJson:
    """A ``get_json`` through kubernetes.core's ``get_api_client`` (exec plugins, proxies...).

    Raises:
        KubeListError: kubernetes.core or the kubernetes library is missing, or the client cannot
            be configured.
    """
    try:
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
    except ImportError as exc:
        raise KubeListError("these connection settings need the kubernetes.core collection and the kubernetes "
                            f"Python library: {exc}") from exc
    kwargs = {k: v for k, v in auth.items() if v is not None and v != ""}
    try:
        api_client = get_api_client(**kwargs).client.client
    except Exception as exc:  # ConfigException, CoreException, missing files
        raise KubeListError(f"cannot configure the Kubernetes client: {type(exc).__name__}: {exc}") from exc
    server = api_client.configuration.host

    def get_json(path: str, query: dict) -> dict:
        headers = {"Accept": "application/json"}
        try:
            if hasattr(api_client, "param_serialize"):  # kubernetes >= 34 (openapi-generator 7 layout)
                method, url, hdrs, body, post = api_client.param_serialize(
                    "GET", path, query_params=list(query.items()), header_params=headers,
                    auth_settings=["BearerToken"])
                resp = api_client.call_api(method, url, hdrs, body, post, _request_timeout=timeout)
                data, status = resp.read(), resp.status
            else:  # older clients: call_api builds the request itself and raises ApiException on errors
                resp = api_client.call_api(path, "GET", query_params=list(query.items()), header_params=headers,
                                           auth_settings=["BearerToken"], _preload_content=False,
                                           _return_http_data_only=True, _request_timeout=timeout)
                data, status = resp.data, 200
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status == 410:
                raise Expired(str(exc)) from exc
            if status:
                raise http_error(status, _status_message(status, getattr(exc, "body", b"") or b""), server,
                                 path) from exc
            raise KubeListError(f"cannot reach the Kubernetes API at {server}: {exc}") from exc
        if status == 410:
            raise Expired(_status_message(status, data))
        if status >= 400:
            raise http_error(status, _status_message(status, data), server, path)
        try:
            return dict(json.loads(data))
        except ValueError as exc:
            raise KubeListError(f"{server}{path}: the answer is not JSON: {exc}") from exc

    return get_json


class Expired(KubeListError):
    """The ``continue`` token of a paginated list expired (HTTP 410 Gone)."""


def http_error(status: int, message: str, server: str, path: str) -> KubeListError:
    """A :class:`KubeListError` for an HTTP error status (in ``status``), with what to do about it; ``path`` says
    what was listed (CloudVMs, or launcher Pods for a path of :func:`pod_list_path`)."""
    hints = {401: "the credentials were refused: check api_key / client_cert / the kubeconfig user"}
    if path.rstrip("/").endswith("/pods"):
        what = "launcher Pods"
        hints[403] = "this identity may not list Pods there (config/rbac/tenant-example.yaml grants it in a tenant's " \
                     "namespace)"
    else:
        what = "CloudVMs"
        hints[403] = "this identity may not list CloudVMs there: set namespaces to the ones you may read"
        hints[404] = f"the CloudVM API ({GROUP}/{VERSION} {PLURAL}) is not served: install config/crd/"
    hint = hints.get(status, "")
    return KubeListError(f"listing {what} at {server}{path} failed (HTTP {status}): {message}"
                         + (f"; {hint}" if hint else ""), status=status)


# --------------------------------------------------------------------------- listing


def list_path(namespace: Optional[str]) -> str:
    """The collection path of CloudVMs in ``namespace``, or cluster-wide for None."""
    if namespace:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{urllib.parse.quote(namespace, safe='')}/{PLURAL}"
    return f"/apis/{GROUP}/{VERSION}/{PLURAL}"


def pod_list_path(namespace: Optional[str]) -> str:
    """The collection path of Pods in ``namespace``, or cluster-wide for None."""
    if namespace:
        return f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods"
    return "/api/v1/pods"


def list_objects(get_json: GetJson, namespaces: Iterable[str], label_selector: str = "", field_selector: str = "",
                 page_size: int = 500, path: Callable[[Optional[str]], str] = list_path,
                 keep: Optional[Callable[[dict], dict]] = None) -> tuple[list[dict], int]:
    """All CloudVM objects in ``namespaces`` (all namespaces when empty), page by page; the objects of another
    collection with ``path`` (e.g. :func:`pod_list_path`), each reduced by ``keep`` as its page arrives (so a long
    list of large objects is never held whole).

    One paginated request sequence per namespace, or one cluster-wide; a ``continue`` token that
    expired mid-way (HTTP 410) restarts that namespace's list once from the beginning.

    Returns:
        ``(items, requests)``: the objects and the number of HTTP requests made.

    Raises:
        KubeListError: from ``get_json``.
    """
    items: list[dict] = []
    requests = 0
    targets: list[Optional[str]] = list(namespaces) or [None]
    for namespace in targets:
        for attempt in (1, 2):
            got: list[dict] = []
            query = {"limit": str(page_size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            try:
                while True:
                    requests += 1
                    page = get_json(path(namespace), query)
                    listed = page.get("items") or []
                    got.extend([keep(item) for item in listed] if keep else listed)
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        break
                    query["continue"] = token
            except Expired:
                if attempt == 2:
                    raise
                continue
            items.extend(got)
            break
    return items, requests
