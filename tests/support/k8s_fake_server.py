"""A local HTTP server serving the Kubernetes API paths our code reads and writes, recording requests.

* Static objects: ``K8sFakeServer(objects={"/api/v1/nodes": {...}, ...})``; anything else is a
  404 ``Status`` like a real API server returns.
* The TrainJob CRD of an installed Trainer release (``trainer_version``), with the spec fields of
  that release's schema (``TRAINJOB_SPEC_FIELDS``), at
  ``/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org``.
* TrainJobs (``trainer.kubeflow.org/v1alpha1``): create (409 if the name exists), get, delete,
  and list with ``?watch=true`` streaming ``ADDED``/``MODIFIED`` events as newline-delimited
  JSON. A created job walks through ``script``: a list of ``(delay_s, status)`` applied in
  order, each bumping ``resourceVersion`` and emitting a ``MODIFIED`` event, the way the Trainer
  controller updates ``status.conditions``. Creation honours ``dryRun=All`` (nothing stored) and
  ``fieldValidation=Strict``: a spec field the installed release's schema lacks is refused with
  HTTP 400 ``TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding
  error: unknown field "spec.<name>"``, as kube-apiserver words it (its ``transformDecodeError``
  with the strict decoder's message); without ``Strict`` such a field is pruned, as for any
  structural CRD schema.
* Events (``/api/v1/namespaces/<ns>/events``): ``events`` added by a test, filtered by a
  ``type=...`` field selector.
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
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org"
EVENTS = "/api/v1/namespaces/{ns}/events"

# spec.properties of the TrainJob CRD's v1alpha1 schema, per release: kubeflow/trainer
# manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml at tags v2.0.0, v2.1.0 and v2.2.0.
TRAINJOB_SPEC_FIELDS = {
    "2.0": ("annotations", "initializer", "labels", "managedBy", "podSpecOverrides", "runtimeRef", "suspend",
            "trainer"),
    "2.1": ("annotations", "initializer", "labels", "managedBy", "podTemplateOverrides", "runtimeRef", "suspend",
            "trainer"),
    "2.2": ("activeDeadlineSeconds", "initializer", "managedBy", "runtimePatches", "runtimeRef", "suspend",
            "trainer"),
}  # fmt: skip


def trainjob_crd(version: str) -> dict:
    """The parts of the TrainJob CustomResourceDefinition a client can read: its served schema's spec fields."""
    spec_fields = {name: {"type": "object"} for name in TRAINJOB_SPEC_FIELDS[version]}
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": spec_fields}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
        "spec": {"group": "trainer.kubeflow.org", "names": {"kind": "TrainJob", "plural": "trainjobs"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema}}]},
    }  # fmt: skip


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
        if method == "GET" and path == CRD:
            if not fake.trainer_installed:
                return self._send(
                    404, _status(404, "NotFound", f'customresourcedefinitions "{parts[-1]}" not found')
                )
            return self._send(200, fake.objects.get(CRD) or trainjob_crd(fake.trainer_version))
        if method == "GET" and len(parts) == 5 and parts[:2] == ["api", "v1"] and parts[4] == "events":
            return self._events(parts[3], query)
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
            unknown = sorted(set(body.get("spec") or {}) - set(TRAINJOB_SPEC_FIELDS[fake.trainer_version]))
            if unknown and query.get("fieldValidation") == "Strict":
                fields = ", ".join(f'unknown field "spec.{f}"' for f in unknown)
                message = f'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: {fields}'
                return self._send(400, _status(400, "BadRequest", message))
            body = copy.deepcopy(body)
            for field in unknown:  # pruned, as a structural schema does without Strict
                del body["spec"][field]
            if query.get("dryRun") == "All":
                return self._send(201, {**body, "status": {}})
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

    def _events(self, ns, query):
        selector = query.get("fieldSelector", "")
        wanted = selector.split("=", 1)[1] if selector.startswith("type=") else None
        items = [e for e in self.server_ref.k8s_events if e["metadata"]["namespace"] == ns]
        items = [e for e in items if wanted is None or e.get("type") == wanted]
        return self._send(200, {"kind": "EventList", "apiVersion": "v1", "items": items, "metadata": {}})

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
                 forbidden: tuple[str, ...] = (), controller=None, trainer_version: str = "2.2"):  # fmt: skip
        self.objects = dict(objects or {})
        self.script = list(script or [])
        # controller(server, namespace, name, manifest): plays the Trainer controller for a created job
        # (e.g. runs the nodes' command for real and sets the conditions); runs in a thread.
        self.controller = controller
        self.trainer_installed = trainer_installed
        self.trainer_version = trainer_version  # a key of TRAINJOB_SPEC_FIELDS
        self.k8s_events: list[dict] = []  # core/v1 Events, see add_event
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

    def add_event(
        self, ns: str, kind: str, name: str, reason: str, message: str, type_: str = "Warning"
    ) -> None:
        """A core/v1 Event about ``kind/name``, as the scheduler, the Job controller or the Trainer records one."""
        with self.lock:
            self.k8s_events.append({
                "apiVersion": "v1", "kind": "Event", "type": type_, "reason": reason, "message": message,
                "metadata": {"name": f"{name}.{len(self.k8s_events):x}", "namespace": ns,
                             "uid": f"event-{len(self.k8s_events)}", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "involvedObject": {"kind": kind, "name": name, "namespace": ns},
                "count": 1, "lastTimestamp": "2026-01-01T00:00:00Z", "source": {"component": "test"},
            })  # fmt: skip

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
