"""An authenticating reverse proxy: only requests with ``Authorization: Bearer <token>`` reach the server.

In Kubeflow the Model Registry server does not check tokens itself: kube-rbac-proxy or Istio
(a ``RequestAuthentication`` with an ``AuthorizationPolicy``) in front of it does, and answers
401 to a request without a valid bearer token. This proxy plays that part in front of the real
registry server of the tests, so a client that stops sending its token is refused as it would be
on a cluster. It forwards method, path, headers and body unchanged, and the upstream's answer
likewise, and records the ``Authorization`` header of every request it was sent (``requests``).
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Per connection, not end to end (RFC 9110 section 7.6.1): never forwarded.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    authorization: str | None
    status: int  # what the proxy answered


class BearerTokenProxy:
    """``with BearerTokenProxy(upstream_url, token) as proxy:`` serves ``proxy.url`` on 127.0.0.1."""

    def __init__(self, upstream: str, token: str):
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 80
        self.token = token
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="bearer-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def record(self, seen: SeenRequest) -> None:
        with self._lock:
            self.requests.append(seen)

    def __enter__(self) -> BearerTokenProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _handle(self) -> None:
        proxy: BearerTokenProxy = self.server.proxy  # type: ignore[attr-defined]
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._reply(411, [], b"a request body needs a Content-Length here\n")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        authorization = self.headers.get("Authorization")
        if authorization != f"Bearer {proxy.token}":
            proxy.record(SeenRequest(self.command, self.path, authorization, 401))
            message = {"code": "Unauthorized", "message": "a valid bearer token is required"}
            headers = [
                ("Content-Type", "application/json"),
                ("WWW-Authenticate", 'Bearer realm="model-registry"'),
            ]
            self._reply(401, headers, json.dumps(message).encode())
            return
        forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=forwarded)
            answer = upstream.getresponse()
            data = answer.read()
        except OSError as exc:
            proxy.record(SeenRequest(self.command, self.path, authorization, 502))
            self._reply(502, [], f"upstream unreachable: {exc}\n".encode())
            return
        finally:
            upstream.close()
        proxy.record(SeenRequest(self.command, self.path, authorization, answer.status))
        kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP | {"content-length"}]
        self._reply(answer.status, kept, data)

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # the test reads ``requests``; stderr stays quiet
