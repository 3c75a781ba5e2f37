"""A stand-in for Kubeflow Trainer's status server (v2.3.0 ``pkg/statusserver``): real HTTPS, real checks.

It serves ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` on 127.0.0.1
with a self-signed certificate made here (``cryptography``), answers 403 unless the request carries
``Authorization: Bearer <the token>``, and 422 unless the body is what Trainer's API accepts
(``UpdateTrainJobStatusRequest``: int32 percentage 0..100 and seconds >= 0, metrics as strings of 1..64
characters, at most 256, an RFC 3339 ``lastUpdatedTime``). ``env()`` gives the three variables Trainer's
``TrainJobStatus`` plugin injects, pointing at the CA and token files written here.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def write_self_signed(cert_path: Path, key_path: Path) -> None:
    """A CA-capable self-signed certificate for 127.0.0.1 and localhost, and its key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-trainer-status-server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def body_problem(body: object) -> str:
    """Why Trainer would refuse ``body`` ('' when it is a valid ``UpdateTrainJobStatusRequest``)."""
    if not isinstance(body, dict) or set(body) - {"trainerStatus"}:
        return f"unexpected fields {sorted(body) if isinstance(body, dict) else type(body).__name__}"
    status = body.get("trainerStatus")
    if status is None:
        return ""
    unknown = set(status) - {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    if unknown:
        return f"unknown trainerStatus fields {sorted(unknown)}"
    try:
        datetime.datetime.fromisoformat(status["lastUpdatedTime"].replace("Z", "+00:00"))
    except (KeyError, AttributeError, ValueError):
        return "lastUpdatedTime is required, RFC 3339"
    for field, low, high in (("progressPercentage", 0, 100), ("estimatedRemainingSeconds", 0, 2**31 - 1)):
        value = status.get(field)
        if value is not None and (type(value) is not int or not low <= value <= high):
            return f"{field}={value!r} is not an integer in [{low}, {high}]"
    metrics = status.get("metrics", [])
    if not isinstance(metrics, list) or len(metrics) > 256:
        return "metrics must be a list of at most 256"
    for metric in metrics:
        if not isinstance(metric, dict) or set(metric) != {"name", "value"}:
            return f"metric {metric!r} must have exactly name and value"
        if not all(isinstance(metric[k], str) and 1 <= len(metric[k]) <= 64 for k in ("name", "value")):
            return f"metric {metric!r}: name and value must be strings of 1..64 characters"
    return ""


class StatusServer:
    """The status endpoint of TrainJob ``namespace/name`` over HTTPS; ``received`` holds the accepted bodies."""

    def __init__(self, root: Path, namespace: str = "team-a", name: str = "cifar10-train"):
        root.mkdir(parents=True, exist_ok=True)
        self.ca_file, key_file = root / "ca.crt", root / "tls.key"
        write_self_signed(self.ca_file, key_file)
        self.token = secrets.token_urlsafe(24)
        self.token_file = root / "token"
        self.token_file.write_text(self.token + "\n")
        self.path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        self.received: list[dict] = []
        self.refused: list[tuple[int, str]] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key_file)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}{self.path}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StatusServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def env(self) -> dict[str, str]:
        return {
            "KUBEFLOW_TRAINER_SERVER_URL": self.url,
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(self.ca_file),
            "KUBEFLOW_TRAINER_SERVER_TOKEN": str(self.token_file),
        }


def _handler(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: the test reads ``received`` and ``refused``
            pass

        def _answer(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self, code: int, message: str) -> None:
            server.refused.append((code, message))
            self._answer(code, {"kind": "Status", "status": "Failure", "message": message, "code": code})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length) if 0 < length <= 1 << 16 else b""
            if self.path != server.path:
                return self._refuse(404, "Not found")
            if self.headers.get("Authorization") != f"Bearer {server.token}":
                return self._refuse(403, "Forbidden")
            try:
                body = json.loads(raw)
            except ValueError:
                return self._refuse(422, "Invalid payload")
            problem = body_problem(body)
            if problem:
                return self._refuse(422, problem)
            server.received.append(body)
            self._answer(200, body)

    return Handler
