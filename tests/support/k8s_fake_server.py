"""A local HTTP server serving the Kubernetes API paths our code reads and writes, recording requests.

* Static objects: ``K8sFakeServer(objects={"/api/v1/nodes": {...}, ...})``; anything else is a
  404 ``Status`` like a real API server returns.
* TrainJobs (``trainer.kubeflow.org/v1alpha1``): create (409 if the name exists), get, delete,
  and list with ``?watch=true`` streaming ``ADDED``/``MODIFIED`` events as newline-delimited
  JSON. A created job walks through ``script``: a list of ``(delay_s, status)`` applied in
  order, each bumping ``resourceVersion`` and emitting a ``MODIFIED`` event, the way the Trainer
  controller updates ``status.conditions``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: dict | None


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    server_ref: K8sFakeServer

    def log_message(self, *args):
        pass

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake = self.server_ref
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = unquote(url.path)
        fake.requests.append(Recorded(method, path, query, body))
        if fake.forbidden and any(path.startswith(p) for p in fake.forbidden):
            return self._send(403, _status(403, "Forbidden", f"forbidden: {path}"))
        parts = path.strip("/").split("/")
        if (
            path.startswith("/apis/trainer.kubeflow.org/v1alpha1/namespaces/")
            and len(parts) >= 6
            and parts[5] == "trainjobs"
        ):
            return self._trainjobs(method, parts[4], parts[6] if len(parts) > 6 else None, query, body)
        if method == "GET" and path in fake.objects:
            return self._send(200, fake.objects[path])
        return self._send(404, _status(404, "NotFound", f"{path} not found"))

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_DELETE(self):
        self._handle("DELETE")

    # -- TrainJobs ------------------------------------------------------------------------

    def _trainjobs(self, method, ns, name, query, body):
        fake = self.server_ref
        if not fake.trainer_installed:
            return self._send(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
        if method == "POST" and name is None:
            job_name = body["metadata"]["name"]
            with fake.lock:
                if (ns, job_name) in fake.trainjobs:
                    return self._send(
                        409, _status(409, "AlreadyExists", f'trainjobs "{job_name}" already exists')
                    )
                obj = copy.deepcopy(body)
                obj["metadata"].update(
                    namespace=ns, uid=f"uid-{job_name}", resourceVersion=fake.next_version()
                )
                obj["status"] = {}
                fake.trainjobs[(ns, job_name)] = obj
                fake.emit(ns, job_name, "ADDED")
            fake.start_script(ns, job_name)
            return self._send(201, obj)
        if method == "GET" and name:
            obj = fake.trainjobs.get((ns, name))
            return (
                self._send(200, obj)
                if obj
                else self._send(404, _status(404, "NotFound", f'trainjobs "{name}" not found'))
            )
        if method == "DELETE" and name:
            with fake.lock:
                obj = fake.trainjobs.pop((ns, name), None)
                if obj:
                    fake.emit(ns, name, "DELETED", obj)
            return (
                self._send(200, {"kind": "Status", "status": "Success"})
                if obj
                else self._send(404, _status(404, "NotFound", name))
            )
        if method == "GET" and query.get("watch") in ("true", "1"):
            return self._watch(ns, query)
        if method == "GET":
            items = [o for (n, _), o in fake.trainjobs.items() if n == ns]
            return self._send(
                200,
                {"kind": "TrainJobList", "items": items, "metadata": {"resourceVersion": str(fake.version)}},
            )
        return self._send(405, _status(405, "MethodNotAllowed", method))

    def _watch(self, ns, query):
        fake = self.server_ref
        selector = query.get("fieldSelector", "")
        wanted = selector.split("=", 1)[1] if selector.startswith("metadata.name=") else None
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        while time.monotonic() < deadline:
            with fake.lock:
                events = [e for e in fake.events if e["ns"] == ns and (wanted is None or e["name"] == wanted)]
            for event in events[sent:]:
                if int(event["object"]["metadata"]["resourceVersion"]) > since:
                    self.wfile.write(
                        (json.dumps({"type": event["type"], "object": event["object"]}) + "\n").encode()
                    )
                    self.wfile.flush()
            sent = len(events)
            time.sleep(0.02)
        self.close_connection = True


class K8sFakeServer:
    """``with K8sFakeServer(objects) as k8s: ...``; point the kubernetes client at ``k8s.url``."""

    def __init__(self, objects: dict | None = None, *, script=None, trainer_installed: bool = True,
                 forbidden: tuple[str, ...] = (), controller=None):  # fmt: skip
        self.objects = dict(objects or {})
        self.script = list(script or [])
        # controller(server, namespace, name, manifest): plays the Trainer controller for a created job
        # (e.g. runs the nodes' command for real and sets the conditions); runs in a thread.
        self.controller = controller
        self.trainer_installed = trainer_installed
        self.forbidden = forbidden
        self.requests: list[Recorded] = []
        self.trainjobs: dict = {}
        self.events: list = []
        self.version = 100
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def emit(self, ns: str, name: str, kind: str, obj: dict | None = None) -> None:
        obj = copy.deepcopy(obj or self.trainjobs[(ns, name)])
        self.events.append({"ns": ns, "name": name, "type": kind, "object": obj})

    def set_status(self, ns: str, name: str, status: dict) -> None:
        with self.lock:
            obj = self.trainjobs.get((ns, name))
            if obj is None:
                return
            obj["status"] = copy.deepcopy(status)
            obj["metadata"]["resourceVersion"] = self.next_version()
            self.emit(ns, name, "MODIFIED")

    def start_script(self, ns: str, name: str) -> None:
        if self.controller is not None:
            manifest = copy.deepcopy(self.trainjobs[(ns, name)])
            threading.Thread(target=self.controller, args=(self, ns, name, manifest), daemon=True).start()
            return

        def play():
            for delay, status in self.script:
                time.sleep(delay)
                self.set_status(ns, name, status)

        threading.Thread(target=play, daemon=True).start()

    def requests_to(self, method: str, prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]

    def __enter__(self) -> K8sFakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
