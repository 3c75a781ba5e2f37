"""The one pin table for every Go binary of the real control-plane harness.

Every binary is built from its Go module through the Go module proxy (gobuild.py); nothing is
downloaded from anywhere else. Why these versions:

- Kubernetes v1.36.3: Trainer v2.3.0 is built against the k8s.io v0.36 libraries (its go.mod), and
  the Kubeflow distribution tests on current Kubernetes releases; v1.36.3 is the newest v1.36 patch
  the proxy serves (v1.34.0 .. v1.37.2 are served).
- etcd v3.6.8: the release Kubernetes v1.36.3 itself tests against (hack/lib/etcd.sh ETCD_VERSION).
- kwok v0.8.0: newest served; it needs Go 1.26, which this machine has.
- kustomize v5.8.1: the newest v5 that builds with Go 1.26 (v5.8.2+ was not tried; see env notes).
- Trainer v2.2.1 pairs with the JobSet its go.mod names (v0.11.1); Trainer v2.3.0 with v0.12.0.
- Kubeflow Model Registry v0.3.0: Kubeflow's manifests ship v0.3.4 (Kubeflow 1.11.0) and v0.3.8
  (master), but the Go module proxy refuses every github.com/kubeflow/model-registry version after
  v0.3.0 here ("403 Forbidden ... This module version is not available"); v0.3.0 is the newest it
  serves, with the same proxy command, embedmd datastore and /api/model_registry/v1alpha3 API as
  v0.3.4. The Python client is pinned to match (pyproject.toml: model-registry==0.3.0).
- The real node: the kubelet at the control plane's release; containerd v2.4.2, runc v1.5.3 and the
  CNI plugins v1.10.0, the newest releases the proxy serves (containerd 2.4 speaks the CRI v1 the
  v1.36 kubelet requires).
- CoreDNS v1.15.0: the cluster DNS of the real node's pods (clusterdns.py), the newest release the
  proxy serves; its go.mod has no replace directives, so it builds in its own module directory.
"""

from __future__ import annotations

import dataclasses

KUBERNETES = "v1.36.3"
ETCD = "v3.6.8"
KWOK = "v0.8.0"
KUSTOMIZE = "v5.8.1"
JOBSET_MODULE = "sigs.k8s.io/jobset"
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
KWOK_MODULE = "sigs.k8s.io/kwok"
MODEL_REGISTRY = "v0.3.0"
MODEL_REGISTRY_MODULE = "github.com/kubeflow/model-registry"
# The real node (node.py): containerd, runc and the CNI plugins the kubelet drives.
CONTAINERD = "v2.4.2"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
RUNC = "v1.5.3"
CNI_PLUGINS = "v1.10.0"
CNI_PLUGINS_MODULE = "github.com/containernetworking/plugins"
# The KFP backend (kfp.py): the release our users run newest, and the Argo Workflows its go.mod pins.
KFP = "2.17.0"
KFP_MODULE = "github.com/kubeflow/pipelines"
ARGO = "v4.0.5"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
# The real node's cluster DNS (clusterdns.py).
COREDNS = "v1.15.0"
COREDNS_MODULE = "github.com/coredns/coredns"
# The KFP UI's gRPC-web proxy in front of ML Metadata (kfp_ui.py): upstream runs Envoy there, which
# cannot be built here; improbable-eng's grpcwebproxy speaks the same gRPC-web the UI's client sends.
GRPCWEB = "v0.15.0"
GRPCWEB_MODULE = "github.com/improbable-eng/grpc-web"
#: The CNI plugins the node's bridge network uses, by their directory under plugins/.
NODE_CNI_PLUGINS = {"bridge": "main", "loopback": "main", "host-local": "ipam", "portmap": "meta"}


@dataclasses.dataclass(frozen=True)
class GoBinary:
    """How one binary is built.

    `wrapper` names a directory under gomod/ holding a committed go.mod/go.sum: used where the
    module's own go.mod has replace directives (then `go install module@version` is refused).
    Without a wrapper the binary is built with `go install package@version`, which uses exactly the
    module's own go.mod.
    """

    name: str
    module: str
    version: str
    package: str
    wrapper: str | None = None
    ldflags: tuple[str, ...] = ()
    # Build tags, and whether cgo is on: runc alone needs cgo (its nsexec is C, seccomp is libseccomp).
    tags: tuple[str, ...] = ()
    cgo: bool = False
    # A source tree of sources.py to build in, for releases the proxy cannot hand over whole.
    source: str | None = None


def _kube_version_ldflags(version: str) -> tuple[str, ...]:
    # What Kubernetes' hack/lib/version.sh stamps, so that /version and `kubectl version` report
    # the release rather than v0.0.0-master (doctor reads the server version).
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return tuple(flags)


def _kube(name: str, wrapper: str = "kubernetes") -> GoBinary:
    return GoBinary(
        name=name,
        module="k8s.io/kubernetes",
        version=KUBERNETES,
        package=f"k8s.io/kubernetes/cmd/{name}",
        wrapper=wrapper,
        ldflags=_kube_version_ldflags(KUBERNETES),
    )


def _containerd(name: str) -> GoBinary:
    return GoBinary(
        name,
        CONTAINERD_MODULE,
        CONTAINERD,
        f"{CONTAINERD_MODULE}/cmd/{name}",
        ldflags=(f"-X {CONTAINERD_MODULE}/version.Version={CONTAINERD}",),
        tags=("urfave_cli_no_docs",),
    )


def _cni(name: str, kind: str) -> GoBinary:
    return GoBinary(name, CNI_PLUGINS_MODULE, CNI_PLUGINS, f"{CNI_PLUGINS_MODULE}/plugins/{kind}/{name}")


def _kfp(name: str, package: str, **kw) -> GoBinary:
    # KFP tags carry no "v"; the tree is the tag's commit (sources.KFP_COMMIT).
    return GoBinary(name, KFP_MODULE, KFP, f"{KFP_MODULE}/{package}", source=f"kfp-{KFP}", **kw)


def _argo(name: str) -> GoBinary:
    return GoBinary(name, ARGO_MODULE, ARGO, f"{ARGO_MODULE}/cmd/{name}", source=f"argo-workflows-{ARGO}")


def _jobset(version: str) -> GoBinary:
    # The JobSet manager is main.go at the module root.
    return GoBinary("jobset", JOBSET_MODULE, version, JOBSET_MODULE)


def _trainer(version: str) -> GoBinary:
    return GoBinary(
        "trainer-controller-manager",
        TRAINER_MODULE,
        version,
        f"{TRAINER_MODULE}/cmd/trainer-controller-manager",
    )


_ALL: tuple[GoBinary, ...] = (
    GoBinary(
        "kustomize",
        "sigs.k8s.io/kustomize/kustomize/v5",
        KUSTOMIZE,
        "sigs.k8s.io/kustomize/kustomize/v5",
    ),
    _kube("kubectl"),
    _kube("kube-apiserver"),
    _kube("kube-controller-manager"),
    _kube("kube-scheduler"),
    GoBinary("etcd", "go.etcd.io/etcd/server/v3", ETCD, "go.etcd.io/etcd/server/v3", "etcd"),
    GoBinary("kwok", KWOK_MODULE, KWOK, f"{KWOK_MODULE}/cmd/kwok"),
    _jobset("v0.11.1"),
    _jobset("v0.12.0"),
    _trainer("v2.2.1"),
    _trainer("v2.3.0"),
    # The server is main.go at the module root; the wrapper maps its replace of pkg/openapi.
    GoBinary(
        "model-registry", MODEL_REGISTRY_MODULE, MODEL_REGISTRY, MODEL_REGISTRY_MODULE, "model-registry"
    ),
    # The real node. The kubelet has a wrapper of its own (gomod/kubelet): it needs modules the
    # control plane does not, and growing gomod/kubernetes/go.sum would rebuild the control plane.
    _kube("kubelet", wrapper="kubelet"),
    _containerd("containerd"),
    _containerd("ctr"),
    _containerd("containerd-shim-runc-v2"),
    # runc as its Makefile builds it, minus the libpathrs tag (a Rust library Debian does not ship;
    # without it runc uses its Go path-safety code): cgo on, seccomp through Debian's libseccomp-dev.
    GoBinary(
        "runc",
        "github.com/opencontainers/runc",
        RUNC,
        "github.com/opencontainers/runc",
        tags=("seccomp", "urfave_cli_no_docs"),
        cgo=True,
    ),
    *(_cni(name, kind) for name, kind in NODE_CNI_PLUGINS.items()),
    # The pods' cluster DNS: coredns.go is the main package at the module root.
    GoBinary("coredns", COREDNS_MODULE, COREDNS, COREDNS_MODULE),
    # The KFP backend. The API server links go-sqlite3 (its storage package uses sqlite3's error
    # type), which needs cgo; the driver and launcher are static netgo builds, as upstream's
    # backend/Dockerfile.driver and Dockerfile.launcher make them.
    _kfp("kfp-apiserver", "backend/src/apiserver", cgo=True),
    _kfp("kfp-persistence-agent", "backend/src/agent/persistence"),
    _kfp("kfp-scheduledworkflow", "backend/src/crd/controller/scheduledworkflow"),
    _kfp("kfp-driver", "backend/src/v2/cmd/driver", tags=("netgo",)),
    _kfp("kfp-launcher", "backend/src/v2/cmd/launcher-v2", tags=("netgo",)),
    _argo("workflow-controller"),
    _argo("argoexec"),
    GoBinary("grpcwebproxy", GRPCWEB_MODULE, GRPCWEB, f"{GRPCWEB_MODULE}/go/grpcwebproxy"),
)

#: name -> version -> how to build it. The first version listed for a name is its default.
BINARIES: dict[str, dict[str, GoBinary]] = {}
for _b in _ALL:
    BINARIES.setdefault(_b.name, {})[_b.version] = _b


@dataclasses.dataclass(frozen=True)
class TrainerStackPin:
    trainer: str
    jobset: str


#: The two Trainer/JobSet pairs under test; each JobSet is the one the Trainer's go.mod names.
TRAINER_STACKS: dict[str, TrainerStackPin] = {
    "2.2": TrainerStackPin(trainer="v2.2.1", jobset="v0.11.1"),
    "2.3": TrainerStackPin(trainer="v2.3.0", jobset="v0.12.0"),
}


def spec(name: str, version: str | None = None) -> GoBinary:
    """The pin for `name` at `version` (its default version when None)."""
    versions = BINARIES.get(name)
    if versions is None:
        raise KeyError(f"unknown binary {name!r}; pinned: {', '.join(sorted(BINARIES))}")
    if version is None:
        return next(iter(versions.values()))
    if version not in versions:
        raise KeyError(
            f"binary {name!r} is not pinned at {version!r}; pinned versions: {', '.join(versions)}"
        )
    return versions[version]


def components() -> list[tuple[str, str]]:
    """(component, version) rows for the closing table."""
    return [(b.name, b.version) for b in _ALL]
