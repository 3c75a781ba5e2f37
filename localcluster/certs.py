"""Certificates and kubeconfigs made at start, for a control plane that lives only on 127.0.0.1.

What kube-apiserver needs mirrors controller-runtime envtest
(sigs.k8s.io/controller-runtime pkg/internal/testing/controlplane/apiserver.go: a serving cert,
a client CA, and a service-account key pair for --service-account-key-file /
--service-account-signing-key-file). Client identities are x509 client certificates: the API server
takes the user from the CN and the groups from the O fields, which is how kubeadm makes its
admin, controller-manager and scheduler kubeconfigs.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import ipaddress
import pathlib

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclasses.dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A throw-away CA: one per control plane (cluster CA) and one per webhook server."""

    def __init__(self, common_name: str):
        self._key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        name = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.key_pem = _key_pem(self._key)

    def _issue(self, subject: x509.Name, usage, sans: list | None = None) -> KeyPair:
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def serving(self, common_name: str, dns: list[str], ips: list[str]) -> KeyPair:
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        return self._issue(_name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, user: str, groups: list[str] | tuple[str, ...] = ()) -> KeyPair:
        return self._issue(_name(user, tuple(groups)), ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_keys() -> KeyPair:
    """The RSA key pair that signs service-account tokens (cert_pem holds the public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))


def write_pair(directory: pathlib.Path, stem: str, pair: KeyPair) -> tuple[pathlib.Path, pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    key.chmod(0o600)
    return cert, key


def write_kubeconfig(
    path: pathlib.Path,
    server: str,
    ca_pem: bytes,
    user: str,
    pair: KeyPair | None = None,
    token: str | None = None,
) -> pathlib.Path:
    """A kubeconfig with the CA and the client certificate (or a bearer token) embedded."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    if pair is not None:
        credentials = {"client-certificate-data": b64(pair.cert_pem), "client-key-data": b64(pair.key_pem)}
    elif token is not None:
        credentials = {"token": token}
    else:
        raise ValueError(f"the kubeconfig for {user!r} needs a client certificate or a token")
    cluster = {"server": server, "certificate-authority-data": b64(ca_pem)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cifar10-kfp-test", "cluster": cluster}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "cifar10-kfp-test", "context": {"cluster": "cifar10-kfp-test", "user": user}}],
        "current-context": "cifar10-kfp-test",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
