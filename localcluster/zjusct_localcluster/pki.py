"""Throw-away PKI for the test control plane, generated with the ``cryptography`` package.

All keys are ECDSA P-256 (every Kubernetes component accepts them and they are generated in
microseconds, unlike RSA). Certificates are valid for 7 days from one minute ago.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=7)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key written as PEM files."""

    cert: Path
    key: Path

    def cert_b64(self) -> str:
        """The certificate PEM, base64-encoded (kubeconfig ``*-data`` form)."""
        return base64.b64encode(self.cert.read_bytes()).decode()

    def key_b64(self) -> str:
        """The private key PEM, base64-encoded (kubeconfig ``*-data`` form)."""
        return base64.b64encode(self.key.read_bytes()).decode()


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


class PKI:
    """A CA plus the leaf certificates and the service-account key pair of one test cluster.

    Args:
        directory: where the PEM files are written (created if missing).

    Raises:
        OSError: the directory cannot be written.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._ca_key = _new_key()
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        ca_name = _name("zjusct-test-ca")
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        self.ca.cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._ca_key, self.ca.key)

        sa_key = _new_key()
        self.sa_private = self.dir / "sa.key"
        self.sa_public = self.dir / "sa.pub"
        _write_key(sa_key, self.sa_private)
        self.sa_public.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @classmethod
    def load(cls, directory: Path) -> PKI:
        """Open the PKI an earlier :class:`PKI` wrote to ``directory`` (to issue more leaf certificates).

        Raises:
            OSError: ``ca.crt``/``ca.key`` cannot be read.
            ValueError: they are not a PEM certificate and an EC private key.
        """
        self = cls.__new__(cls)
        self.dir = directory
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self.ca.key} is not an EC private key")
        self._ca_key = key
        self.sa_private = directory / "sa.key"
        self.sa_public = directory / "sa.pub"
        return self

    def issue(
        self,
        name: str,
        common_name: str,
        orgs: tuple[str, ...] = (),
        *,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Issue a leaf certificate signed by the CA and write ``<name>.crt`` / ``<name>.key``.

        Args:
            name: file name stem.
            common_name: subject CN (Kubernetes user name for client certificates).
            orgs: subject O values (Kubernetes group names for client certificates).
            server: add the serverAuth extended key usage.
            client: add the clientAuth extended key usage.
            dns: DNS subject alternative names.
            ips: IP subject alternative names.

        Returns:
            The written key pair.
        """
        key = _new_key()
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, orgs))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), critical=False
            )
        )
        if dns or ips:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def write_kubeconfig(path: Path, server: str, ca: KeyPair, client: KeyPair, user: str) -> Path:
    """Write a self-contained kubeconfig (certificates embedded) for one client identity.

    Args:
        path: the file to write (mode 0600).
        server: API server URL, e.g. ``https://127.0.0.1:6443``.
        ca: the cluster CA (only the certificate is embedded).
        client: the client certificate and key.
        user: name of the user/context entry.

    Returns:
        ``path``.
    """
    # JSON is valid YAML: no YAML writer needed.
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "zjusct-test", "cluster": {"server": server, "certificate-authority-data": ca.cert_b64()}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate-data": client.cert_b64(), "client-key-data": client.key_b64()}}
        ],
        "contexts": [{"name": user, "context": {"cluster": "zjusct-test", "user": user}}],
        "current-context": user,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    path.chmod(0o600)
    return path
