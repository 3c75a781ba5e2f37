"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok playing the kubelets of a few nodes (some with nvidia.com/gpu).

Flags follow controller-runtime envtest (pkg/internal/testing/controlplane/apiserver.go and
etcd.go, v0.24.1) for etcd and the API server, with what envtest leaves out switched on: RBAC and
Node authorization, NodeRestriction and PodSecurity admission, and the ServiceAccount admission
plugin (envtest disables it). The controller manager and scheduler run as kubeadm runs them
(their own client certificates, --use-service-account-credentials). Everything is on free ports of
127.0.0.1, state lives in a temporary directory, and every process is stopped on exit.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import ssl
import subprocess
import tempfile
import time

from localcluster import certs, gobuild, kwok_stages, procs, reaper, versions

SERVICE_CIDR = "10.0.0.0/24"
_START_TIMEOUT_S = 180.0


class ControlPlane:
    """`with ControlPlane() as cp:` starts everything; `cp.kubeconfig` is the admin identity."""

    def __init__(
        self,
        cpu_nodes: int = 2,
        gpu_nodes: int = 4,
        gpus_per_node: int = 2,
        auto_complete: bool = False,
        state_dir: pathlib.Path | None = None,
    ):
        self.cpu_nodes, self.gpu_nodes, self.gpus_per_node = cpu_nodes, gpu_nodes, gpus_per_node
        self.auto_complete = auto_complete
        self._own_dir = state_dir is None
        self.dir = pathlib.Path(state_dir or tempfile.mkdtemp(prefix="cifar10-kfp-cluster-"))
        if self._own_dir:
            reaper.track_dir(self.dir)
        self.procs: dict[str, procs.Process] = {}
        self.server = ""
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.started_in_s: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        # A free port is found by binding port 0 and releasing it; another process can take it
        # before the component binds. That one race gets a second, clean attempt.
        for attempt in (1, 2):
            try:
                self.start()
                return self
            except Exception as exc:
                self._stop_processes()
                if attempt == 2 or "address already in use" not in str(exc):
                    self.stop()
                    raise
                shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        binaries = {
            n: gobuild.ensure_binary(n)
            for n in (
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
                "kwok",
            )
        }
        self._kubectl_bin = binaries["kubectl"]
        self._make_certs()
        self._start_etcd(binaries["etcd"])
        self._start_apiserver(binaries["kube-apiserver"])
        self._start_controller_manager(binaries["kube-controller-manager"])
        self._start_scheduler(binaries["kube-scheduler"])
        self._start_kwok(binaries["kwok"])
        self._create_nodes()
        procs.wait_for(
            "the default service account",
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default").returncode == 0,
            _START_TIMEOUT_S,
            self._procs(),
        )
        self.started_in_s = round(time.monotonic() - started, 1)

    def _stop_processes(self) -> None:
        for name in reversed(list(self.procs)):
            self.procs.pop(name).stop()

    def stop(self) -> None:
        self._stop_processes()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            reaper.untrack("dir", self.dir)

    def _procs(self) -> list[procs.Process]:
        return list(self.procs.values())

    # -- certificates --------------------------------------------------------------------
    def _make_certs(self) -> None:
        pki = self.dir / "pki"
        self.ca = certs.CertificateAuthority("cifar10-kfp-test-ca")
        (pki / "ca.crt").parent.mkdir(parents=True, exist_ok=True)
        self.ca_file = pki / "ca.crt"
        self.ca_file.write_bytes(self.ca.cert_pem)
        # The CA key signs kubelet-style and client certs inside the kcm (CSR signing) too.
        self.ca_key_file = pki / "ca.key"
        self.ca_key_file.write_bytes(self.ca.key_pem)
        self.ca_key_file.chmod(0o600)
        serving = self.ca.serving(
            "kube-apiserver",
            [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ["127.0.0.1", "10.0.0.1"],
        )
        self.serving_cert, self.serving_key = certs.write_pair(pki, "apiserver", serving)
        self.sa_pub, self.sa_key = certs.write_pair(pki, "sa", certs.service_account_keys())
        self._admin_pair = self.ca.client("cifar10-kfp-admin", ["system:masters"])
        self.admin_cert, self.admin_key = certs.write_pair(pki, "admin", self._admin_pair)

    def kubeconfig_for(self, user: str, groups: list[str] | tuple[str, ...] = ()) -> pathlib.Path:
        """A kubeconfig authenticating as `user` in `groups`: an x509 client certificate, so the
        user name is at most 64 characters. A service account: service_account_kubeconfig.
        """
        safe = "".join(c if c.isalnum() or c in "-." else "_" for c in user)
        digest = hashlib.sha256("\0".join(groups).encode()).hexdigest()[:10]
        path = self.dir / "kubeconfigs" / f"{safe}-{digest}.kubeconfig"
        if not path.exists():
            certs.write_kubeconfig(
                path, self.server, self.ca.cert_pem, user, self.ca.client(user, list(groups))
            )
        return path

    def service_account_kubeconfig(self, namespace: str, name: str) -> pathlib.Path:
        """A kubeconfig for service account namespace/name (created if missing) holding a bound
        token from the TokenRequest API: what a pod of that account holds."""
        sa = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }
        self.kubectl_ok("apply", "-f", "-", input=json.dumps(sa))
        token = self.kubectl_ok("create", "token", name, "-n", namespace, "--duration=48h").stdout.strip()
        path = self.dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig"
        return certs.write_kubeconfig(path, self.server, self.ca.cert_pem, f"{namespace}/{name}", token=token)

    def _ssl_admin(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return ctx

    # -- components ----------------------------------------------------------------------
    def _start_etcd(self, binary: pathlib.Path) -> None:
        client, peer = procs.free_port(), procs.free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        argv = [
            str(binary),
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",  # a throw-away store: durability buys nothing, fsync costs seconds
            "--log-level=warn",
        ]
        proc = self.procs["etcd"] = procs.Process("etcd", argv, self.dir / "logs")

        def healthy() -> bool:
            import urllib.request

            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=5) as resp:
                return json.loads(resp.read()).get("health") == "true"

        procs.wait_for("etcd", healthy, _START_TIMEOUT_S, [proc])

    def _start_apiserver(self, binary: pathlib.Path) -> None:
        port = procs.free_port()
        self.server = f"https://127.0.0.1:{port}"
        argv = [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / 'apiserver-certs'}",
            f"--tls-cert-file={self.serving_cert}",
            f"--tls-private-key-file={self.serving_key}",
            f"--client-ca-file={self.ca_file}",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # PodTolerationRestriction and PodNodeSelector: a namespace's annotations send its pods to the
            # real node (its toleration and its label), for pods whose spec the tests do not write.
            "--enable-admission-plugins=NodeRestriction,PodSecurity,PodTolerationRestriction,PodNodeSelector",
            "--allow-privileged=true",
            "--profiling=false",
        ]
        proc = self.procs["kube-apiserver"] = procs.Process("kube-apiserver", argv, self.dir / "logs")
        certs.write_kubeconfig(
            self.kubeconfig, self.server, self.ca.cert_pem, "cifar10-kfp-admin", self._admin_pair
        )
        ctx = self._ssl_admin()
        procs.wait_for(
            "kube-apiserver /readyz",
            lambda: procs.https_ok(f"{self.server}/readyz", ctx),
            _START_TIMEOUT_S,
            [proc],
        )

    def _component_kubeconfig(self, user: str) -> pathlib.Path:
        path = self.dir / "kubeconfigs" / f"{user.replace(':', '_')}.kubeconfig"
        return certs.write_kubeconfig(path, self.server, self.ca.cert_pem, user, self.ca.client(user))

    def _start_healthz_component(self, name: str, binary: pathlib.Path, user: str, extra: list[str]) -> None:
        port = procs.free_port()
        kubeconfig = self._component_kubeconfig(user)
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            *extra,
        ]
        proc = self.procs[name] = procs.Process(name, argv, self.dir / "logs")
        ctx = procs.insecure_context()
        procs.wait_for(
            f"{name} /healthz",
            lambda: procs.https_ok(f"https://127.0.0.1:{port}/healthz", ctx),
            _START_TIMEOUT_S,
            [proc],
        )

    def _start_controller_manager(self, binary: pathlib.Path) -> None:
        self._start_healthz_component(
            "kube-controller-manager",
            binary,
            "system:kube-controller-manager",
            [
                f"--cert-dir={self.dir / 'kcm-certs'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.sa_key}",
                f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={self.ca_key_file}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
            ],
        )

    def _start_scheduler(self, binary: pathlib.Path) -> None:
        self._start_healthz_component(
            "kube-scheduler", binary, "system:kube-scheduler", [f"--cert-dir={self.dir / 'scheduler-certs'}"]
        )

    def _start_kwok(self, binary: pathlib.Path) -> None:
        module = gobuild.module_dir(versions.KWOK_MODULE, versions.KWOK)
        config = kwok_stages.write_config(self.dir / "kwok-stages.yaml", module, self.auto_complete)
        # kwok writes node and pod status for many nodes, so it is a privileged client (a real
        # kubelet is system:node:<name>, which NodeRestriction would limit to its own node).
        kubeconfig = self.dir / "kubeconfigs" / "kwok.kubeconfig"
        certs.write_kubeconfig(
            kubeconfig, self.server, self.ca.cert_pem, "kwok", self.ca.client("kwok", ["system:masters"])
        )
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={kwok_stages.KWOK_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.1",
        ]
        self.procs["kwok"] = procs.Process("kwok", argv, self.dir / "logs")

    def _create_nodes(self) -> None:
        nodes = [kwok_stages.node_manifest(f"kwok-cpu-{i}", 0) for i in range(self.cpu_nodes)]
        nodes += [
            kwok_stages.node_manifest(f"kwok-gpu-{i}", self.gpus_per_node) for i in range(self.gpu_nodes)
        ]
        self.node_names = [n["metadata"]["name"] for n in nodes]
        self.kubectl_ok(
            "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
        )

        def all_ready() -> bool:
            out = json.loads(self.kubectl_ok("get", "nodes", "-o", "json").stdout)
            ready = {
                n["metadata"]["name"]
                for n in out["items"]
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            }
            return set(self.node_names) <= ready

        procs.wait_for("kwok nodes Ready", all_ready, _START_TIMEOUT_S, self._procs(), interval_s=0.5)

    # -- clients -------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 60,
        kubeconfig: pathlib.Path | None = None,
    ) -> subprocess.CompletedProcess:
        """Run the pinned kubectl as admin (or as `kubeconfig`); never raises on a non-zero exit."""
        return subprocess.run(
            # Its discovery and HTTP caches go with the cluster, not into ~/.kube/cache (one more
            # folder per cluster there, forever).
            [str(self._kubectl_bin), f"--kubeconfig={kubeconfig or self.kubeconfig}",
             f"--cache-dir={self.dir / 'kubectl-cache'}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=procs.child_env(),
        )  # fmt: skip

    def kubectl_ok(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """kubectl that raises with kubectl's own message when it fails."""
        proc = self.kubectl(*args, **kwargs)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def wait_for(self, what: str, check, timeout_s: float = 60) -> None:
        """Poll check() until true; fails early if a component of the control plane died."""
        procs.wait_for(what, check, timeout_s, self._procs(), interval_s=0.3)

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create a namespace and wait for its default service account (pods need it)."""
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        self.kubectl_ok("create", "-f", "-", input=json.dumps(ns))
        self.wait_for(
            f"service account default in {name}",
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0,
        )
        return name

    # -- pod outcomes (kwok stages, see kwok_stages.py) --------------------------------------
    def succeed_pod(self, namespace: str, name: str) -> None:
        """Make a Running pod's containers exit 0 (kwok's pod-complete stage, keyed on a label)."""
        self.kubectl_ok(
            "label", "pod", name, "-n", namespace, "--overwrite", f"{kwok_stages.SUCCEED_LABEL}=succeeded"
        )

    def fail_pod(
        self,
        namespace: str,
        name: str,
        exit_code: int = 1,
        reason: str = "Error",
        message: str = "container failed",
    ) -> None:
        """Make a Running pod's containers terminate with exit_code (kwok's chaos stage)."""
        pre = kwok_stages.FAIL_ANNOTATION_PREFIX
        patch = {
            "metadata": {
                "labels": {kwok_stages.FAIL_LABEL: "true"},
                "annotations": {
                    f"{pre}exit-code": str(exit_code),
                    f"{pre}reason": reason,
                    f"{pre}message": message,
                },
            }
        }
        self.kubectl_ok("patch", "pod", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def wait_object(
        self,
        kind: str,
        namespace: str,
        name: str,
        condition,
        *,
        what: str,
        timeout_s: float = 60,
        interval_s: float = 0.5,
        also_watch: list[procs.Process] | tuple[procs.Process, ...] = (),
    ) -> dict:
        """Poll the object until condition(obj) holds; returns it. Fails early if a watched process died."""
        found: dict = {}

        def reached() -> bool:
            proc = self.kubectl("get", kind, name, "-n", namespace, "-o", "json")
            if proc.returncode != 0:
                return False
            found.update(json.loads(proc.stdout))
            return bool(condition(found))

        procs.wait_for(what, reached, timeout_s, self._procs() + list(also_watch), interval_s=interval_s)
        return found

    def wait_pod_phase(self, namespace: str, name: str, phase: str, timeout_s: float = 60) -> dict:
        """Wait until the pod reaches `phase`; returns the pod."""
        return self.wait_object(
            "pod", namespace, name, lambda pod: pod.get("status", {}).get("phase") == phase,
            what=f"pod {namespace}/{name} phase {phase}", timeout_s=timeout_s,
        )  # fmt: skip
