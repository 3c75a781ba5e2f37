"""A local HTTP server implementing the KFP v2beta1 endpoints our CLI calls through ``kfp.Client``.

Experiments, runs and recurring runs are kept in memory; every request is recorded
(method, path, query, JSON body) so tests assert on exactly what the real client sent.
Only the behaviour the client relies on is implemented: create/get/list (with the
``display_name`` EQUALS filter the client uses to find an experiment by name), recurring
run enable/disable/delete, and run listing sorted newest first.

What it is still for, in ``make test`` (no cluster there): recording what our CLI and ``kfp.Client``
send, which the real server does not show: the bearer on every call, the token re-read from its file,
the gateway's session cookie (no oauth2-proxy runs here). Whether a token, a header or a missing one
is accepted, and in which namespace, is asked of the real multi-user API server and the real
kube-apiserver instead (tests/cluster/test_multi_user.py); the refusal tests that used this moved there.

``KfpFakeServer(token=..., session_cookie=...)`` plays multi-user Kubeflow: every API call except
``healthz`` must carry ``Authorization: Bearer <token>`` (the API server's TokenReview authenticator)
or the session cookie (what the gateway's oauth2-proxy turns into a ``kubeflow-userid`` header);
otherwise it answers 401 with the API server's own messages (kubeflow/pipelines 2.17.0,
backend/src/apiserver/auth/auth.go ``IdentityHeaderMissingError`` and
backend/src/apiserver/auth/authenticator_token_review.go ``doTokenReview``; gRPC code 16 =
Unauthenticated, mapped to HTTP 401 by grpc-gateway).
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

API = "/apis/v2beta1"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: dict | None
    headers: dict = field(default_factory=dict)  # lower-cased names


@dataclass
class KfpState:
    token: str | None = None  # multi-user: the bearer token the TokenReview accepts
    session_cookie: str | None = None  # multi-user: "name=value" of a logged-in gateway session
    experiments: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    recurring_runs: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _matches(item: dict, filter_json: str | None) -> bool:
    if not filter_json:
        return True
    for predicate in json.loads(filter_json).get("predicates", []):
        key = predicate.get("key")
        want = predicate.get("string_value", predicate.get("stringValue"))
        op = predicate.get("operation", predicate.get("op"))
        if op in ("EQUALS", 1) and key in ("display_name", "name") and item.get("display_name") != want:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    state: KfpState

    def log_message(self, *args):  # keep test output clean
        pass

    # -- plumbing -------------------------------------------------------------------

    def _body(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = self._body() if method in ("POST", "PUT", "PATCH") else None
        self.state.requests.append(
            Recorded(method, url.path, query, body, {k.lower(): v for k, v in self.headers.items()})
        )
        if not url.path.startswith(API):
            return self._send(404, {"error": f"not found: {url.path}"})
        parts = url.path[len(API) :].strip("/").split("/")
        refusal = self._authentication_error() if parts[0] != "healthz" else None
        if refusal:
            return self._send(401, {"error": refusal, "code": 16, "message": refusal, "details": []})
        handler = getattr(self, f"_{parts[0]}", None)
        if handler is None:
            return self._send(404, {"error": f"unknown collection {parts[0]}"})
        status, payload = handler(method, parts[1:], query, body)
        self._send(status, payload)

    def _authentication_error(self) -> str | None:
        """None when the request may pass; else the API server's Unauthenticated message."""
        state = self.state
        if state.token is None and state.session_cookie is None:
            return None  # standalone KFP: no authentication
        cookies = {c.strip() for c in (self.headers.get("Cookie") or "").split(";")}
        if state.session_cookie is not None and state.session_cookie in cookies:
            return None
        authorization = self.headers.get("Authorization")
        if not authorization:
            return "Request header error: there is no user identity header."
        if not authorization.startswith("Bearer "):
            return "Request header error: Authorization header does not have expected prefix 'Bearer '"
        if authorization.removeprefix("Bearer ") != state.token:
            return "Review.Status.Authenticated is false. Error [invalid bearer token, token lookup failed]"
        return None

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # -- collections ----------------------------------------------------------------

    def _healthz(self, method, rest, query, body):
        multi_user = self.state.token is not None or self.state.session_cookie is not None
        return 200, {"commit_sha": "fake", "tag_name": "2.17.3", "multi_user": multi_user}

    def _listing(self, items: dict, key: str, query: dict):
        found = [item for item in items.values() if _matches(item, query.get("filter"))]
        if query.get("experiment_id"):
            found = [i for i in found if i.get("experiment_id") == query["experiment_id"]]
        found.sort(key=lambda i: i.get("created_at", ""), reverse="desc" in (query.get("sort_by") or ""))
        size = int(query.get("page_size") or 0) or len(found)
        return 200, {key: found[:size], "total_size": len(found)} if found else {}

    def _experiments(self, method, rest, query, body):
        exps = self.state.experiments
        if method == "POST" and not rest:
            exp = {
                **body,
                "experiment_id": str(uuid.uuid4()),
                "created_at": _now(),
                "storage_state": "AVAILABLE",
            }
            exps[exp["experiment_id"]] = exp
            return 200, exp
        if method == "GET" and not rest:
            return self._listing(exps, "experiments", query)
        if method == "GET" and rest[0] in exps:
            return 200, exps[rest[0]]
        return 404, {"error": "experiment not found"}

    def _runs(self, method, rest, query, body):
        runs = self.state.runs
        if method == "POST" and not rest:
            if not body.get("pipeline_spec") and not body.get("pipeline_version_reference"):
                return 400, {"error": "a run needs a pipeline_spec or a pipeline_version_reference"}
            run = {**body, "run_id": str(uuid.uuid4()), "created_at": _now(), "state": "PENDING"}
            runs[run["run_id"]] = run
            return 200, run
        if method == "GET" and not rest:
            return self._listing(runs, "runs", query)
        if method == "GET" and rest[0] in runs:
            return 200, runs[rest[0]]
        return 404, {"error": "run not found"}

    def _recurringruns(self, method, rest, query, body):
        jobs = self.state.recurring_runs
        if method == "POST" and not rest:
            job = {**body, "recurring_run_id": str(uuid.uuid4()), "created_at": _now()}
            job["status"] = "ENABLED" if body.get("mode", "ENABLE") in ("ENABLE", None) else "DISABLED"
            jobs[job["recurring_run_id"]] = job
            return 200, job
        if method == "GET" and not rest:
            return self._listing(jobs, "recurringRuns", query)
        job_id, _, action = rest[0].partition(":")
        if job_id not in jobs:
            return 404, {"error": "recurring run not found"}
        if method == "GET":
            return 200, jobs[job_id]
        if method == "DELETE":
            del jobs[job_id]
            return 200, {}
        if method == "POST" and action in ("enable", "disable"):
            jobs[job_id]["status"] = "ENABLED" if action == "enable" else "DISABLED"
            return 200, {}
        return 400, {"error": f"unsupported {method} {rest}"}


class KfpFakeServer:
    """``with KfpFakeServer() as kfp: kfp.Client(host=kfp.url)``; ``kfp.state.requests`` records calls."""

    def __init__(self, *, token: str | None = None, session_cookie: str | None = None):
        self.state = KfpState(token=token, session_cookie=session_cookie)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def requests(self, method: str | None = None, path_prefix: str = "") -> list[Recorded]:
        return [
            r for r in self.state.requests
            if (method is None or r.method == method) and r.path.startswith(API + path_prefix)
        ]  # fmt: skip

    def add_run(self, display_name: str, state: str = "SUCCEEDED", experiment_id: str = "", **extra) -> dict:
        """Seed a finished run (as if it had been submitted earlier)."""
        run = {"run_id": str(uuid.uuid4()), "display_name": display_name, "state": state,
               "experiment_id": experiment_id, "created_at": _now(), **extra}  # fmt: skip
        self.state.runs[run["run_id"]] = run
        return run

    def __enter__(self) -> KfpFakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
