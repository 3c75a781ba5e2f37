"""The real JobSet and Kubeflow Trainer controller managers, with their webhooks, on a ControlPlane.

Everything applied comes from the modules' own manifests in the Go module cache, rendered with the
pinned kustomize (they are kustomize bases; the Helm chart of Trainer v2.3.0 holds the same objects):

- JobSet: config/components/{crd,webhook,manager,rbac} (v0.11.1 and v0.12.0 have the same layout);
- Trainer: manifests/base/{crds,webhook,manager,rbac,runtimes} (v2.2.x and v2.3.0).

Each manager runs as a local process with its module's own configuration file, changed only where a
process on 127.0.0.1 needs it: no leader election, no metrics server, health and webhook ports on
free ports, and its certificate management off (Trainer: `certManagement.enable: false`, JobSet:
`internalCertManagement.enable: false`), because "certificates must be provided externally"
(Trainer cmd/trainer-controller-manager/main.go): the harness makes the webhook serving certificate,
puts it where controller-runtime's webhook server reads it ($TMPDIR/k8s-webhook-server/serving-certs),
and rewrites every webhook clientConfig from the in-cluster Service to `url: https://127.0.0.1:<port>`
with the caBundle set. Each manager authenticates as its upstream service account
(a bound token of service account <ns>/<name>) and is bound to its module's own ClusterRole, so it runs with
exactly the permissions upstream grants it.
"""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import time
import urllib.request

import yaml

from localcluster import certs, gobuild, procs, versions
from localcluster.controlplane import ControlPlane

_WAIT_S = 180.0
TORCH_RUNTIME = "torch-distributed"


def _kustomize(path: pathlib.Path) -> list[dict]:
    binary = gobuild.ensure_binary("kustomize")
    out = subprocess.run([str(binary), "build", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kustomize build {path} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _point_at(client_config: dict, port: int, ca_pem: bytes) -> None:
    path = client_config.pop("service")["path"]
    client_config["url"] = f"https://127.0.0.1:{port}{path}"
    client_config["caBundle"] = base64.b64encode(ca_pem).decode()


def _webhook_objects(docs: list[dict], port: int, ca_pem: bytes, prefix: str) -> list[dict]:
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    out = []
    for doc in docs:
        if doc["kind"] not in kinds:
            continue
        # Upstream names are generic (mutating-webhook-configuration): prefix them per component.
        doc["metadata"]["name"] = f"{prefix}-{doc['metadata']['name']}"
        for hook in doc["webhooks"]:
            _point_at(hook["clientConfig"], port, ca_pem)
        out.append(doc)
    return out


class _Manager:
    """One controller manager process with its serving certificate and health endpoint."""

    def __init__(self, cp: ControlPlane, name: str, namespace: str, service_account: str):
        self.cp, self.name = cp, name
        self.dir = cp.dir / name
        self.webhook_port, self.health_port = procs.free_port(), procs.free_port()
        self.ca = certs.CertificateAuthority(f"{name}-webhook-ca")
        serving = self.ca.serving(name, ["localhost"], ["127.0.0.1"])
        # controller-runtime's webhook server reads tls.crt/tls.key from this directory by default.
        self.tmpdir = self.dir / "tmp"
        cert_dir = self.tmpdir / "k8s-webhook-server" / "serving-certs"
        cert, key = certs.write_pair(cert_dir, "tls", serving)
        self.namespace, self.service_account = namespace, service_account
        self.kubeconfig = cp.service_account_kubeconfig(namespace, service_account)
        self.proc: procs.Process | None = None

    def start(self, argv: list[str]) -> None:
        env = {"TMPDIR": str(self.tmpdir), "KUBECONFIG": str(self.kubeconfig)}
        self.proc = procs.Process(self.name, argv, self.cp.dir / "logs", env=env)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as resp:
                    return resp.status == 200
            except OSError:
                return False

        procs.wait_for(f"{self.name} /readyz", ready, _WAIT_S, [self.proc])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


class TrainerStack:
    """Trainer + JobSet installed on a control plane; `stop()` removes them again."""

    def __init__(self, cp: ControlPlane, stack: str):
        if stack not in versions.TRAINER_STACKS:
            raise ValueError(f"unknown trainer stack {stack!r}; known: {', '.join(versions.TRAINER_STACKS)}")
        pin = versions.TRAINER_STACKS[stack]
        self.cp, self.stack = cp, stack
        self.version, self.jobset_version = pin.trainer, pin.jobset
        self.trainer_dir = gobuild.module_dir(versions.TRAINER_MODULE, pin.trainer)
        self.jobset_dir = gobuild.module_dir(versions.JOBSET_MODULE, pin.jobset)
        self._applied: list[dict] = []
        self.jobset = self.trainer = None
        self.started_in_s: float | None = None

    # -- install ---------------------------------------------------------------------------
    def install(self) -> TrainerStack:
        started = time.monotonic()
        jobset_bin = gobuild.ensure_binary("jobset", self.jobset_version)
        trainer_bin = gobuild.ensure_binary("trainer-controller-manager", self.version)
        for ns in ("jobset-system", "kubeflow-system"):
            self._apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
        self.jobset = _Manager(
            self.cp, f"jobset-{self.jobset_version}", "jobset-system", "jobset-controller-manager"
        )
        self.trainer = _Manager(
            self.cp, f"trainer-{self.version}", "kubeflow-system", "kubeflow-trainer-controller-manager"
        )
        self._install_crds()
        self._bind_role(self.jobset, self.jobset_dir / "config/components/rbac", "manager-role")
        self._bind_role(
            self.trainer, self.trainer_dir / "manifests/base/rbac", "kubeflow-trainer-controller-manager"
        )
        self.jobset.start([str(jobset_bin), f"--config={self._jobset_config()}", "--zap-log-level=info"])
        self.trainer.start([str(trainer_bin), f"--config={self._trainer_config()}", "--zap-log-level=info"])
        self._apply(
            _webhook_objects(
                _kustomize(self.jobset_dir / "config/components/webhook"),
                self.jobset.webhook_port,
                self.jobset.ca.cert_pem,
                "jobset",
            )
        )
        self._apply(
            _webhook_objects(
                _kustomize(self.trainer_dir / "manifests/base/webhook"),
                self.trainer.webhook_port,
                self.trainer.ca.cert_pem,
                "trainer",
            )
        )
        self._install_runtime()
        self.started_in_s = round(time.monotonic() - started, 1)
        return self

    def _apply(self, docs: list[dict]) -> None:
        self.cp.kubectl_ok(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )
        self._applied.extend(docs)

    def _install_crds(self) -> None:
        crds = _kustomize(self.jobset_dir / "config/components/crd") + _kustomize(
            self.trainer_dir / "manifests/base/crds"
        )
        for crd in crds:
            conversion = crd["spec"].get("conversion") or {}
            if conversion.get("strategy") == "Webhook":
                # JobSet serves one version, so the API server never converts; the webhook still
                # has to name a reachable endpoint for the CRD to be valid.
                _point_at(
                    conversion["webhook"]["clientConfig"], self.jobset.webhook_port, self.jobset.ca.cert_pem
                )
        self._apply(crds)
        names = [f"crd/{c['metadata']['name']}" for c in crds]
        self.cp.kubectl_ok("wait", "--for=condition=Established", "--timeout=120s", *names, timeout=130)

    def _bind_role(self, mgr: _Manager, rbac_dir: pathlib.Path, role_name: str) -> None:
        roles = [
            d
            for d in _kustomize(rbac_dir)
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role_name
        ]
        if len(roles) != 1:
            raise RuntimeError(f"{rbac_dir} has no ClusterRole {role_name!r}")
        role = roles[0]
        role["metadata"]["name"] = f"{mgr.name}-{role_name}"
        ns, sa = mgr.namespace, mgr.service_account
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role["metadata"]["name"]},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        }
        self._apply([role, binding])

    def _jobset_config(self) -> pathlib.Path:
        cfg = yaml.safe_load(
            (self.jobset_dir / "config/components/manager/controller_manager_config.yaml").read_text()
        )
        cfg["leaderElection"] = {"leaderElect": False}
        cfg["internalCertManagement"] = {"enable": False}
        cfg["webhook"] = {"port": self.jobset.webhook_port, "host": "127.0.0.1"}
        cfg["metrics"] = {"bindAddress": "0"}
        cfg["health"] = {"healthProbeBindAddress": f"127.0.0.1:{self.jobset.health_port}"}
        path = self.jobset.dir / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _trainer_config(self) -> pathlib.Path:
        cfg = yaml.safe_load(
            (self.trainer_dir / "manifests/base/manager/controller_manager_config.yaml").read_text()
        )
        cfg["leaderElection"]["leaderElect"] = False
        cfg["certManagement"]["enable"] = False
        cfg["webhook"] = {"port": self.trainer.webhook_port, "host": "127.0.0.1"}
        cfg["metrics"] = {"bindAddress": "0", "secureServing": False}
        cfg["health"]["healthProbeBindAddress"] = f"127.0.0.1:{self.trainer.health_port}"
        if "statusServer" in cfg:
            cfg["statusServer"]["port"] = procs.free_port()
        path = self.trainer.dir / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _install_runtime(self) -> None:
        runtime = yaml.safe_load(
            (self.trainer_dir / "manifests/base/runtimes/torch_distributed.yaml").read_text()
        )
        if runtime["metadata"]["name"] != TORCH_RUNTIME:
            raise RuntimeError(f"{self.trainer_dir} torch runtime is named {runtime['metadata']['name']!r}")
        body = json.dumps(runtime)
        # The validating webhook admits the runtime: this is the check that the API server reaches
        # the Trainer's webhook. A new webhook configuration takes a moment to reach the API server.
        procs.wait_for(
            "the Trainer webhook admitting the torch-distributed runtime",
            lambda: self.cp.kubectl("apply", "--server-side", "-f", "-", input=body).returncode == 0,
            _WAIT_S,
            [self.jobset.proc, self.trainer.proc],
            interval_s=0.5,
        )
        self._applied.append(runtime)

    # -- uninstall -------------------------------------------------------------------------
    def stop(self) -> None:
        """Delete what the stack made (while its controllers still run finalizers), then stop them."""
        kubectl = self.cp.kubectl
        for kind in ("trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io"):
            kubectl("delete", kind, "--all", "--all-namespaces", "--wait=true", "--timeout=60s", timeout=90)
        for doc in reversed(self._applied):
            if doc["kind"] in (
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
                "ClusterTrainingRuntime",
            ):
                kubectl(
                    "delete",
                    doc["kind"],
                    doc["metadata"]["name"],
                    "--ignore-not-found",
                    "--timeout=30s",
                    timeout=60,
                )
        for mgr in (self.trainer, self.jobset):
            if mgr is not None:
                mgr.stop()
        crds = [d["metadata"]["name"] for d in self._applied if d["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            self._strip_finalizers(crd)
        if crds:
            kubectl(
                "delete",
                *(f"crd/{c}" for c in crds),
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
                timeout=90,
            )
        self._applied.clear()

    def _strip_finalizers(self, crd: str) -> None:
        # With the controllers stopped nothing would ever remove their finalizers, and the CRD
        # (and the next stack's install) would hang on the leftovers.
        out = self.cp.kubectl("get", crd, "--all-namespaces", "-o", "json")
        if out.returncode != 0:
            return
        for item in json.loads(out.stdout).get("items", []):
            meta = item["metadata"]
            if meta.get("finalizers"):
                ns = ["-n", meta["namespace"]] if meta.get("namespace") else []
                self.cp.kubectl(
                    "patch", crd, meta["name"], *ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
                )


def install_trainer(cp: ControlPlane, stack: str) -> TrainerStack:
    """Install and start the Trainer/JobSet pair `stack` ("2.2" or "2.3") on cp."""
    ts = TrainerStack(cp, stack)
    try:
        return ts.install()
    except BaseException:
        ts.stop()
        raise
