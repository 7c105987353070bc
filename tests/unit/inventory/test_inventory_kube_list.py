"""The Kubernetes lister's pure parts: connection resolution (kubernetes.core precedence) and pagination."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.plugin_utils._kube_list import (
    Expired,
    KubeListError,
    identity_fingerprint,
    list_objects,
    list_path,
    resolve,
)


def write_kubeconfig(path: Path, user: dict, cluster: dict | None = None, current: str = "main") -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443",
                                                          "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}},
                     {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "x"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_token_and_relative_ca_path(tmp_path: Path):
    cfg = write_kubeconfig(tmp_path / "config", {"token": "s3cret"})
    conn = resolve({"kubeconfig": str(cfg)}, env={})
    assert conn.server == "https://127.0.0.1:6443"
    assert conn.token == "s3cret" and conn.ca_file == str(tmp_path / "ca.crt")
    assert not conn.needs_full_client
    assert "s3cret" not in repr(conn), "the token must never show up in a repr"


def test_kubeconfig_embedded_client_certificate_is_decoded(tmp_path: Path):
    pem = "-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    cfg = write_kubeconfig(tmp_path / "config", {
        "client-certificate-data": base64.b64encode(pem.encode()).decode(),
        "client-key-data": base64.b64encode(b"key").decode()})
    conn = resolve({"kubeconfig": str(cfg)}, env={})
    assert conn.client_cert_data == pem and conn.client_key_data == "key"


def test_exec_plugin_user_needs_the_full_client(tmp_path: Path):
    cfg = write_kubeconfig(tmp_path / "config", {"exec": {"command": "get-token", "apiVersion": "x"}})
    conn = resolve({"kubeconfig": str(cfg)}, env={})
    assert conn.needs_full_client and "exec" in conn.why_full_client


def test_explicit_host_and_api_key_need_no_kubeconfig():
    conn = resolve({"host": "https://10.0.0.1:6443/", "api_key": "tok", "validate_certs": False},
                   env={"KUBECONFIG": "/does/not/exist"})
    assert conn.server == "https://10.0.0.1:6443" and conn.token == "tok" and conn.verify is False


def test_explicit_options_override_the_kubeconfig(tmp_path: Path):
    cfg = write_kubeconfig(tmp_path / "config", {"token": "from-file"})
    conn = resolve({"kubeconfig": str(cfg), "api_key": "from-option", "ca_cert": "/etc/ca.pem"}, env={})
    assert conn.token == "from-option" and conn.ca_file == "/etc/ca.pem"


def test_default_kubeconfig_comes_from_the_environment(tmp_path: Path):
    cfg = write_kubeconfig(tmp_path / "config", {"token": "t"})
    assert resolve({}, env={"KUBECONFIG": str(cfg)}).token == "t"


@pytest.mark.parametrize(("auth", "message"), [
    ({"kubeconfig": "/nonexistent/kubeconfig"}, "kubeconfig: /nonexistent/kubeconfig does not exist"),
    ({"kubeconfig": "{cfg}", "context": "nope"}, "context: 'nope' is not in the kubeconfig; contexts: main, other"),
])
def test_bad_kubeconfig_or_context_is_a_clear_error(tmp_path: Path, auth: dict, message: str):
    cfg = write_kubeconfig(tmp_path / "config", {"token": "t"})
    auth = {k: v.format(cfg=cfg) for k, v in auth.items()}
    with pytest.raises(KubeListError) as err:
        resolve(auth, env={})
    assert message in str(err.value)


def test_garbage_kubeconfig_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "config"
    bad.write_text("clusters: [unterminated\n")
    with pytest.raises(KubeListError, match="is not valid YAML"):
        resolve({"kubeconfig": str(bad)}, env={})


class FakeServer:
    """Serves ``items`` in pages like kube-apiserver (limit/continue); can expire one token."""

    def __init__(self, items: list[dict], expire_once: bool = False) -> None:
        self.items = items
        self.calls: list[tuple[str, dict]] = []
        self.expire_once = expire_once

    def __call__(self, path: str, query: dict) -> dict:
        self.calls.append((path, dict(query)))
        start = int(query.get("continue", "0"))
        if start and self.expire_once:
            self.expire_once = False
            raise Expired("continue token expired")
        limit = int(query["limit"])
        page = self.items[start:start + limit]
        more = start + limit < len(self.items)
        return {"items": page, "metadata": {"continue": str(start + limit) if more else ""}}


def test_pagination_follows_continue_until_done_with_one_sequence_per_namespace():
    server = FakeServer([{"n": i} for i in range(1234)])
    items, requests = list_objects(server, [], page_size=500)
    assert len(items) == 1234 and requests == 3
    assert {p for p, _ in server.calls} == {list_path(None)}
    server = FakeServer([{"n": i} for i in range(10)])
    items, requests = list_objects(server, ["a", "b"], label_selector="x=y", field_selector="spec.owner=al",
                                   page_size=500)
    assert requests == 2 and [p for p, _ in server.calls] == [list_path("a"), list_path("b")]
    assert server.calls[0][1] == {"limit": "500", "labelSelector": "x=y", "fieldSelector": "spec.owner=al"}


def test_expired_continue_token_restarts_the_list_once():
    server = FakeServer([{"n": i} for i in range(7)], expire_once=True)
    items, _ = list_objects(server, [], page_size=3)
    assert [i["n"] for i in items] == list(range(7))


def test_identity_fingerprint_separates_identities_and_hides_the_secret(tmp_path: Path):
    def fp(**auth: object) -> str:
        return identity_fingerprint(resolve({"host": "https://10.0.0.1:6443", **auth}, env={}))

    a, b = fp(api_key="token-of-alice"), fp(api_key="token-of-bob")
    assert a != b and a == fp(api_key="token-of-alice")
    assert len(a) == 16 and "token-of-alice" not in a
    assert fp(api_key="token-of-alice", impersonate_user="carol") != a
    assert fp(username="u", password="p1") != fp(username="u", password="p2")
    cert1, cert2 = tmp_path / "1.crt", tmp_path / "2.crt"
    cert1.write_text("cert one")
    cert2.write_text("cert two")
    assert fp(client_cert=str(cert1), client_key="k") != fp(client_cert=str(cert2), client_key="k")
    exec1 = write_kubeconfig(tmp_path / "e1", {"exec": {"command": "get-token", "args": ["--profile", "a"]}})
    exec2 = write_kubeconfig(tmp_path / "e2", {"exec": {"command": "get-token", "args": ["--profile", "b"]}})
    one, two = (identity_fingerprint(resolve({"kubeconfig": str(p)}, env={})) for p in (exec1, exec2))
    assert one != two
    other_context = identity_fingerprint(resolve({"kubeconfig": str(exec1), "context": "other"}, env={}))
    assert other_context != one
