"""The real KFP 2.17.0 UI on the harness: its Node server, the bundle, and a gRPC-web proxy to ML Metadata.

Upstream's ml-pipeline-ui Deployment (manifests/kustomize/base/pipeline/ml-pipeline-ui-deployment.yaml)
runs `node dist/server.js ../client/ 3000` with the API server, ML Metadata's Envoy and the object store
named by environment variables (frontend/server/configs.ts). Here each of them is a host process:

- the bundle and server are kfp_ui_build.py's build of the pinned frontend/;
- the API server is kfp.py's; the UI server proxies /apis/v2beta1 to its REST port;
- ML Metadata is kfppods.py's store. The run pages read it through gRPC-web, which upstream's
  metadata-envoy deployment translates; here improbable-eng's grpcwebproxy (versions.GRPCWEB) does;
- pod logs and the artifact store's Secret come from the Kubernetes API (the admin kubeconfig, where
  upstream mounts the ml-pipeline-ui service account);
- the artifacts: v2 runs record their store as `seaweedfs.kubeflow:9000` and the
  `mlpipeline-minio-artifact` Secret; `MINIO_ENDPOINT_REWRITE` (minio-helper.ts) points that name at
  the embedded store's port on this machine, as a cluster's DNS would.

Use: `with KfpUi(cp, backend, mlmd_address, store) as ui:` then open `ui.url` in a browser.
"""

from __future__ import annotations

import pathlib
import urllib.request

from localcluster import gobuild, kfp_ui_build, procs

_START_TIMEOUT_S = 120
#: The artifact store's name in what a run records (kfppods.py, backend/src/v2/objectstore/config.go).
RECORDED_STORE = "seaweedfs.kubeflow:9000"


class KfpUi:
    def __init__(self, cp, backend, mlmd_address: str, store, log_dir: pathlib.Path | None = None):
        self.cp, self.backend, self.mlmd_address, self.store = cp, backend, mlmd_address, store
        self.log_dir = log_dir or backend.dir / "ui-logs"
        self.procs: list[procs.Process] = []
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> KfpUi:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        root = kfp_ui_build.ensure_ui()
        grpcweb_port = self._start_grpcweb()
        self.port = procs.free_port()
        server = procs.Process(
            "kfp-ui",
            [str(kfp_ui_build.node_binary(root)), "dist/server.js", str(root / "client"), str(self.port)],
            self.log_dir,
            cwd=root / "server",
            env=self._env(grpcweb_port),
        )
        self.procs.append(server)
        procs.wait_for("the KFP UI server", self._healthy, _START_TIMEOUT_S, [server], 0.5)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def _start_grpcweb(self) -> int:
        port = procs.free_port()
        argv = [
            str(gobuild.ensure_binary("grpcwebproxy")),
            f"--backend_addr={self.mlmd_address}",
            "--run_tls_server=false",
            "--server_bind_address=127.0.0.1",
            f"--server_http_debug_port={port}",
            "--allow_all_origins",
            # ML Metadata answers a run page with every artifact and execution of the run at once.
            "--backend_max_call_recv_msg_size=104857600",
        ]
        proxy = procs.Process("grpcwebproxy", argv, self.log_dir)
        self.procs.append(proxy)
        procs.wait_for("the gRPC-web proxy", lambda: _listening(port), _START_TIMEOUT_S, [proxy])
        return port

    def _env(self, grpcweb_port: int) -> dict[str, str]:
        api_host, api_port = self.backend.endpoint.removeprefix("http://").rsplit(":", 1)
        return {
            "KUBECONFIG": str(self.cp.kubeconfig),
            "ML_PIPELINE_SERVICE_HOST": api_host,
            "ML_PIPELINE_SERVICE_PORT": api_port,
            "METADATA_ENVOY_SERVICE_SERVICE_HOST": "127.0.0.1",
            "METADATA_ENVOY_SERVICE_SERVICE_PORT": str(grpcweb_port),
            "FRONTEND_SERVER_NAMESPACE": "kubeflow",
            "MINIO_ENDPOINT_REWRITE": f"{RECORDED_STORE}={self.store.endpoint}",
            # The store's own keys would otherwise default to upstream's well-known minio/minio123;
            # the UI reads each run's keys from the Secret the run names.
            "MINIO_HOST": self.store.endpoint.rsplit(":", 1)[0],
            "MINIO_PORT": self.store.endpoint.rsplit(":", 1)[1],
            "DISABLE_GKE_METADATA": "true",
        }

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/apis/v1beta1/healthz", timeout=3) as resp:  # noqa: S310
            return resp.status == 200


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
