"""What a KFP run's pods on the real node need around them, so that the run can really succeed.

The KFP 2.17.0 API server writes into every Workflow the addresses its pods dial:

- the driver: `--ml_pipeline_server_address ml-pipeline.kubeflow.svc.cluster.local` port 8887 and
  `--mlmd_server_address metadata-grpc-service.kubeflow.svc.cluster.local` port 8080
  (backend/src/v2/compiler/argocompiler/container.go, from v2/config and v2/metadata env.go);
- the launcher: the same, and the artifact store at `seaweedfs.kubeflow:9000` with the
  `mlpipeline-minio-artifact` secret (backend/src/v2/objectstore/config.go,
  DefaultEndpointInMultiUserMode), which our compiled pipelines also use;
- Argo's executor, the driver and the launcher: the Kubernetes API at the `kubernetes` Service.

There is no kube-proxy here. So every name above resolves, through the Workflow defaults'
hostAliases, to the node's bridge address, where a relay on each port leads to the host process
behind it. The node should still have cluster DNS (clusterdns.py, `RealNode(cp, cluster_dns=...)`):
gRPC's Go resolver asks DNS for a TXT record (`_grpc_config.<name>`, its service config) beside the
address from /etc/hosts, and on the host's resolver, which a pod cannot reach, each such lookup
waits out its timeouts before the driver or launcher dials; CoreDNS answers it at once. The `kubernetes` Service's ClusterIP is relayed from the host's loopback
(clusterip.py). ML Metadata is the stand-in served from upstream's C++ store (mlmd.py). The images
the pods start are imported into the node first: the driver, launcher and argoexec (kfpimages.py)
and the component image under the name the committed YAML uses (trainimage.py).

Use: `pods = KfpPods(cp, node, store, work_dir)`, then `KfpBackend(cp, store, pod_defaults=
pods.pod_defaults())`, then `pods.connect(backend)` once its API server listens.
"""

from __future__ import annotations

import json
import pathlib
import time

from localcluster import clusterip, gobuild, kfpimages, mlmd, procs, trainimage
from localcluster.node import HOST_IP, NODE_LABEL, NODE_TOLERATION

NAMESPACE = "kubeflow"
#: The Services a run's pods dial by name (the short and the full form), and their ports.
SERVICES = {
    "ml-pipeline": (8887, 8888),
    "metadata-grpc-service": (8080,),
    "seaweedfs": (9000,),
    "minio-service": (9000,),  # the name of KFP before 2.15, still in its no_proxy default
}


def host_names() -> list[str]:
    names = []
    for service in SERVICES:
        names += [
            f"{service}.{NAMESPACE}",
            f"{service}.{NAMESPACE}.svc",
            f"{service}.{NAMESPACE}.svc.cluster.local",
        ]
    return names


class KfpPods:
    """ML Metadata, the relays and the images that a KFP run's pods on `node` need; a context manager."""

    def __init__(self, cp, node, store, work_dir: pathlib.Path):
        self.cp, self.node, self.store, self.dir = cp, node, store, pathlib.Path(work_dir)
        self.mlmd: mlmd.MlmdServer | None = None
        self._api_relay: clusterip.ClusterIpRelay | None = None
        self.timings: dict[str, float] = {}

    def __enter__(self) -> KfpPods:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.mlmd = mlmd.MlmdServer("127.0.0.1", procs.free_port(), self.dir / "mlmd.sqlite").start()
        self.node.expose(self.mlmd.port, 8080)
        self.node.expose(int(self.store.endpoint.rsplit(":", 1)[1]), 9000)
        self._api_relay = clusterip.kubernetes_service(self.cp)
        self._tolerate_the_real_node()
        self.timings["ML Metadata + relays"] = time.monotonic() - started
        started = time.monotonic()
        kfpimages.import_all(self.node)
        self.timings["driver, launcher, argoexec images"] = time.monotonic() - started
        started = time.monotonic()
        trainimage.ensure_imported(self.node, gobuild.cache_root() / "images")
        self.timings["component image (build + import, or cache hit)"] = time.monotonic() - started

    def _tolerate_the_real_node(self) -> None:
        """Every pod of the namespace tolerates the real node's taint, through the namespace's default
        tolerations (the PodTolerationRestriction admission plugin, plugin/pkg/admission/
        podtolerationrestriction/admission.go, merges them into each new pod's own).

        Not through the Workflow's tolerations: Argo takes a template's tolerations instead of the
        Workflow's, and the train step has its own (the GPU toleration), so it would not get them.
        """
        if self.cp.kubectl("get", "namespace", NAMESPACE).returncode != 0:
            self.cp.kubectl_ok("create", "namespace", NAMESPACE)
        self.cp.kubectl_ok(
            "annotate", "--overwrite", "namespace", NAMESPACE,
            f"scheduler.alpha.kubernetes.io/defaultTolerations={json.dumps([NODE_TOLERATION])}",
        )  # fmt: skip

    def pod_defaults(self) -> dict:
        """Workflow spec defaults: names resolve to the node's bridge, pods go to the real node.

        No step of ours sets a node selector, so the Workflow's reaches every pod."""
        return {
            "hostAliases": [{"ip": HOST_IP, "hostnames": host_names()}],
            "nodeSelector": {NODE_LABEL: "true"},
        }

    def connect(self, backend) -> None:
        """Relay ml-pipeline's gRPC (8887) and REST (8888) ports to `backend` (a KfpBackend)."""
        self.node.expose(backend.grpc_port, 8887)
        self.node.expose(backend.http_port, 8888)

    def stop(self) -> None:
        if self._api_relay is not None:
            self._api_relay.close()
            self._api_relay = None
        if self.mlmd is not None:
            self.mlmd.stop()
            self.mlmd = None
