"""The real Kubeflow Pipelines 2.17.0 backend on the real control plane (controlplane.py).

Everything here is upstream code built from its pinned source (versions.py, sources.py), run as host
processes with a kubeconfig, the way envtest runs kube-apiserver:

- the KFP API server (gRPC + REST), with MySQL (Debian's MariaDB, localcluster/mariadb.py) and the
  embedded SeaweedFS as its object store;
- the persistence agent, which copies Workflow status back into the KFP database;
- the scheduled-workflow controller, which fires recurring runs;
- the Argo Workflows v4.0.5 workflow controller that KFP 2.17.0 pins.

The cluster objects are upstream's own manifests, read from the same source trees: Argo's CRDs
(manifests/base/crds/full), KFP's ScheduledWorkflow CRD
(manifests/kustomize/base/pipeline/cluster-scoped/scheduled-workflow-crd.yaml) and the
pipeline-runner service account and role (manifests/kustomize/base/pipeline/pipeline-runner-*.yaml).
The workflow-controller ConfigMap carries the settings KFP's third-party/argo/base patch sets.

`multi_user=True` starts the API server as manifests/kustomize/base/installs/multi-user/ does
(api-service/params.env: MULTIUSER=true, default-editor as the runs' service account; the identity
header and prefix of base/installs/generic/pipeline-install-config.yaml), with KFP's pipeline rights as
aggregated ClusterRoles (multi-user/view-edit-cluster-roles.yaml, which aggregate into the profiles'
kubeflow-* roles) and the controllers watching every
namespace. Each request is then authenticated by the real kube-apiserver (TokenReview of a bearer
token, or the gateway's `kubeflow-userid` header) and authorized by it (SubjectAccessReview) in the
request's namespace: a profile (profiles.py).

Left out: the v1 cache server (a pod mutating webhook for KFP v1 pipelines; v2 runs cache through the
driver and the API server); the UI is kfp_ui.py. The host processes use the admin kubeconfig
rather than their upstream service-account roles.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request

import yaml

from localcluster import gobuild, procs, reaper, sources, versions
from localcluster.kfpimages import ARGOEXEC_IMAGE, DRIVER_IMAGE, LAUNCHER_IMAGE
from localcluster.mariadb import MariaDB

NAMESPACE = "kubeflow"
BUCKET = "mlpipeline"
_KFP_TREE = f"kfp-{versions.KFP}"
_ARGO_TREE = f"argo-workflows-{versions.ARGO}"
_START_TIMEOUT_S = 180
_BINARIES = ("kfp-apiserver", "kfp-persistence-agent", "kfp-scheduledworkflow", "workflow-controller")


#: The Pod Security Standards the runs' namespace may enforce (KfpBackend's `pod_security`), the default first.
POD_SECURITY_LEVELS = ("restricted", "baseline")

#: Argo's polling as the harness runs it: 1 s where Argo's defaults wait 5 s (executor) and 10 s (controller).
FAST_POLLING = {"WAIT_CONTAINER_STATUS_CHECK_INTERVAL": "1s", "DEFAULT_REQUEUE_TIME": "1s"}


def _workflow_controller_config(pod_defaults: dict | None, fast_polling: bool = True) -> dict[str, str]:
    # As KFP's manifests/kustomize/third-party/argo/base/workflow-controller-configmap-patch.yaml,
    # minus the artifact repository (KFP v2 artifacts go through the launcher, not Argo).
    executor = {
        "imagePullPolicy": "IfNotPresent",
        # The wait container polls the main container's end every 5 s by default; every step pays up to
        # that twice (driver and executor pod). 1 s is what Argo's own e2e setup and KFP's CI charts use
        # (Argo docs/environment-variables.md, "Executor"). A harness setting, not a product one.
        "env": [
            {
                "name": "WAIT_CONTAINER_STATUS_CHECK_INTERVAL",
                "value": FAST_POLLING["WAIT_CONTAINER_STATUS_CHECK_INTERVAL"],
            }
        ]
        if fast_polling
        else [],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    spec: dict = {
        "ttlStrategy": {"secondsAfterCompletion": 3600},
        "templateDefaults": {"retryStrategy": {"limit": "2", "retryPolicy": "OnError"}},
        # Where a run's pods go and what they resolve (kfppods.py): Workflow-wide spec fields.
        **(pod_defaults or {}),
    }
    return {"executor": json.dumps(executor), "workflowDefaults": json.dumps({"spec": spec})}


class KfpBackend:
    """Start with `with KfpBackend(cp, store) as kfp:`; `kfp.endpoint` is the REST API for kfp.Client.

    `pod_defaults` are Workflow spec fields (hostAliases, nodeSelector, tolerations) that Argo's
    workflowDefaults gives every run, so that its pods can run on the real node (kfppods.py).
    `fast_polling=False` keeps Argo's own polling intervals (benchmarks/bench_kfp_overhead.py compares).
    `pod_security` is the Pod Security Standard the runs' namespace enforces: `restricted`, as a security
    team hardens a profile namespace (our compiled pipelines run there, pipelines/policy.py says how);
    `baseline` is what KFP's own manifests enforce in `kubeflow`, for pipelines whose images run as root.
    """

    def __init__(
        self, cp, store, pod_defaults: dict | None = None, fast_polling: bool = True,
        pod_security: str = "restricted", multi_user: bool = False,
    ):  # fmt: skip
        if pod_security not in POD_SECURITY_LEVELS:
            raise ValueError(f"pod_security={pod_security!r}: use one of {', '.join(POD_SECURITY_LEVELS)}")
        self.cp, self.store, self.pod_defaults = cp, store, pod_defaults
        self.fast_polling, self.pod_security, self.multi_user = fast_polling, pod_security, multi_user
        self.dir = cp.dir / ("kfp-multi-user" if multi_user else "kfp")
        self.procs: dict[str, procs.Process] = {}
        self.db: MariaDB | None = None

    def __enter__(self) -> KfpBackend:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        started = time.monotonic()
        self.bin = {name: gobuild.ensure_binary(name) for name in _BINARIES}
        self.kfp_tree = sources.ensure_tree(_KFP_TREE)
        self.argo_tree = sources.ensure_tree(_ARGO_TREE)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._install_cluster_objects()
        # Its own top-level temporary directory: mariadbd runs as `mysql`, which cannot enter cp.dir.
        self.db = MariaDB(reaper.temporary_dir("cifar10-kfp-kfpdb-"), procs.free_port())
        self.db.start()
        self.db.create("mlpipeline", "kfp", global_grants=True)
        self._start_apiserver()
        self._start_controllers()
        self.started_in_s = time.monotonic() - started

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        self.procs.clear()
        if self.db is not None:
            self.db.stop()
            reaper.remove_dir(self.db.work_dir)
            self.db = None

    # -- cluster objects -------------------------------------------------------------------
    def _install_cluster_objects(self) -> None:
        crds = sorted((self.argo_tree / "manifests/base/crds/full").glob("argoproj.io_*.yaml"))
        crds.append(
            self.kfp_tree / "manifests/kustomize/base/pipeline/cluster-scoped/scheduled-workflow-crd.yaml"
        )
        for path in crds:
            self.cp.kubectl_ok("apply", "--server-side", "-f", str(path), timeout=120)
        query = '{.status.conditions[?(@.type=="Established")].status}'
        for crd in ("workflows.argoproj.io", "scheduledworkflows.kubeflow.org"):
            self.cp.wait_for(
                f"CRD {crd} established",
                lambda crd=crd: (
                    self.cp.kubectl("get", "crd", crd, "-o", f"jsonpath={query}").stdout == "True"
                ),
            )
        # The namespace as KFP installs it (manifests/kustomize/cluster-scoped-resources/namespace.yaml:
        # Pod Security `baseline` enforced, `restricted` warned about), enforcing `self.pod_security`.
        # Applied over an existing one, so a label another test left is put back.
        namespace = yaml.safe_load(
            (self.kfp_tree / "manifests/kustomize/cluster-scoped-resources/namespace.yaml").read_text()
        )
        namespace["metadata"]["name"] = NAMESPACE  # the kustomize variable kfp-cluster-scoped-namespace
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = self.pod_security
        self.cp.kubectl_ok("apply", "-f", "-", input=json.dumps(namespace))
        pipeline = self.kfp_tree / "manifests/kustomize/base/pipeline"
        for name in (
            "pipeline-runner-sa.yaml",
            "pipeline-runner-role.yaml",
            "pipeline-runner-rolebinding.yaml",
        ):
            self.cp.kubectl_ok("apply", "-n", NAMESPACE, "-f", str(pipeline / name))
        if self.multi_user:  # KFP's rights, which aggregate into the profiles' kubeflow-* roles (profiles.py)
            self.cp.kubectl_ok("apply", "-f", str(self._multi_user_dir / "view-edit-cluster-roles.yaml"))
        access, secret = self.store.access_key, self.store.secret_key
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "mlpipeline-minio-artifact"},
                "stringData": {"accesskey": access, "secretkey": secret},
            }  # fmt: skip
        )
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kfp-launcher"},
                "data": {"defaultPipelineRoot": f"minio://{BUCKET}/v2/artifacts"},
            }  # fmt: skip
        )
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "workflow-controller-configmap"},
                "data": _workflow_controller_config(self.pod_defaults, self.fast_polling),
            }  # fmt: skip
        )

    def _apply(self, obj: dict) -> None:
        self.cp.kubectl_ok("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(obj))

    @property
    def _multi_user_dir(self):
        return self.kfp_tree / "manifests/kustomize/base/installs/multi-user"

    def _multi_user_env(self) -> dict[str, str]:
        """The API server's multi-user settings, read from the pinned tree's manifests."""
        lines = (self._multi_user_dir / "api-service/params.env").read_text().splitlines()
        params = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
        install = self.kfp_tree / "manifests/kustomize/base/installs/generic/pipeline-install-config.yaml"
        config = yaml.safe_load(install.read_text())["data"]
        return {
            "MULTIUSER": params["MULTIUSER"],
            "DEFAULTPIPELINERUNNERSERVICEACCOUNT": params["DEFAULTPIPELINERUNNERSERVICEACCOUNT"],
            # api-service/deployment-patch.yaml maps these two keys of pipeline-install-config to the env.
            "KUBEFLOW_USERID_HEADER": config["USERID_HEADER"],
            "KUBEFLOW_USERID_PREFIX": config["USERID_PREFIX"],
        }

    # -- processes -------------------------------------------------------------------------
    def _home(self) -> dict[str, str]:
        # The API server's ScheduledWorkflow client reads $HOME/.kube/config (apiserver/client/swf.go).
        home = self.dir / "home"
        (home / ".kube").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.cp.kubeconfig, home / ".kube" / "config")
        return {"HOME": str(home), "KUBECONFIG": str(self.cp.kubeconfig)}

    def _apiserver_env(self) -> dict[str, str]:
        host, port = self.store.endpoint.rsplit(":", 1)
        access, secret = self.store.access_key, self.store.secret_key
        # The environment of upstream's ml-pipeline-apiserver-deployment.yaml, pointed at this
        # machine's MariaDB, object store and images.
        return {
            **self._home(),
            "POD_NAMESPACE": NAMESPACE,
            "CLUSTER_DOMAIN": "cluster.local",
            "OBJECTSTORECONFIG_SECURE": "false",
            "OBJECTSTORECONFIG_BUCKETNAME": BUCKET,
            "OBJECTSTORECONFIG_HOST": host,
            "OBJECTSTORECONFIG_PORT": port,
            "OBJECTSTORECONFIG_REGION": "us-east-1",
            "OBJECTSTORECONFIG_ACCESSKEY": access,
            "OBJECTSTORECONFIG_SECRETACCESSKEY": secret,
            "DBCONFIG_USER": "kfp",
            "DBCONFIG_PASSWORD": "",
            "DBCONFIG_DBNAME": "mlpipeline",
            "DBCONFIG_HOST": "127.0.0.1",
            "DBCONFIG_PORT": str(self.db.port),
            "DB_DRIVER_NAME": "mysql",
            "DBCONFIG_MYSQLCONFIG_USER": "kfp",
            "DBCONFIG_MYSQLCONFIG_PASSWORD": "",
            "DBCONFIG_MYSQLCONFIG_DBNAME": "mlpipeline",
            "DBCONFIG_MYSQLCONFIG_HOST": "127.0.0.1",
            "DBCONFIG_MYSQLCONFIG_PORT": str(self.db.port),
            "V2_DRIVER_IMAGE": DRIVER_IMAGE,
            "V2_LAUNCHER_IMAGE": LAUNCHER_IMAGE,
            "PUBLISH_LOGS": "true",
            # Kubernetes injects these from the ml-pipeline-visualizationserver Service; the
            # visualization server (v1 only) is not run, and nothing here calls it.
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_HOST": "127.0.0.1",
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_PORT": "8888",
            "LOG_LEVEL": "info",
            # What its healthz reports and the UI shows as "Version" (apiserver/main.go; upstream's
            # image bakes these in at build time).
            "TAG_NAME": versions.KFP,
            "COMMIT_SHA": sources.KFP_COMMIT,
            **(self._multi_user_env() if self.multi_user else {}),
        }

    def _start_apiserver(self) -> None:
        self.grpc_port, self.http_port = procs.free_port(), procs.free_port()
        argv = [
            str(self.bin["kfp-apiserver"]),
            f"--config={self.kfp_tree / 'backend/src/apiserver/config'}",
            # ":port", not "host:port": the REST proxy dials "localhost" + this flag (apiserver/main.go).
            f"--rpcPortFlag=:{self.grpc_port}",
            f"--httpPortFlag=127.0.0.1:{self.http_port}",
            f"--webhookPortFlag=127.0.0.1:{procs.free_port()}",
            "--logtostderr=true",
        ]
        proc = self.procs["kfp-apiserver"] = procs.Process(
            "kfp-apiserver", argv, self.dir / "logs", cwd=self.dir, env=self._apiserver_env()
        )
        procs.wait_for("KFP API server /apis/v2beta1/healthz", self._healthy, _START_TIMEOUT_S, [proc], 0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/apis/v2beta1/healthz", timeout=3) as resp:  # noqa: S310
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _with_agent_token(self) -> list[str]:
        """A command prefix giving the persistence agent its service-account token where it looks.

        The agent reads a fixed path (agent/persistence/client/tokenrefresher/token_refresher.go:
        /var/run/secrets/kubeflow/tokens/persistenceagent-sa-token), a projected token in its pod.
        Here it runs in a private mount namespace with a tmpfs on /run holding a real token of its
        service account, so nothing is written to the host's /run.
        """
        self.cp.kubectl("create", "serviceaccount", "ml-pipeline-persistenceagent", "-n", NAMESPACE)
        token = self.cp.kubectl_ok(
            "create", "token", "ml-pipeline-persistenceagent", "-n", NAMESPACE,
            "--audience=pipelines.kubeflow.org", "--duration=24h",
        ).stdout.strip()  # fmt: skip
        token_file = self.dir / "persistenceagent-sa-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        tokens = "/run/secrets/kubeflow/tokens"
        script = (
            f"mount -t tmpfs kfp-tokens /run && mkdir -p {tokens} && "
            f'cp {token_file} {tokens}/persistenceagent-sa-token && exec "$@"'
        )
        return ["unshare", "--mount", "--propagation=private", "sh", "-c", script, "agent"]

    def _start_controllers(self) -> None:
        kubeconfig = str(self.cp.kubeconfig)
        # Multi-user: the agent and the scheduler watch every namespace (their multi-user deployment
        # patches set NAMESPACE to ""); the workflow controller is cluster-wide in both modes.
        watched = "" if self.multi_user else NAMESPACE
        api = ["--mlPipelineAPIServerName=127.0.0.1", f"--mlPipelineServiceGRPCPort={self.grpc_port}"]
        commands = {
            "workflow-controller": [
                str(self.bin["workflow-controller"]), f"--kubeconfig={kubeconfig}", f"--namespace={NAMESPACE}",
                "--configmap=workflow-controller-configmap", f"--executor-image={ARGOEXEC_IMAGE}",
            ],
            "kfp-persistence-agent": [
                *self._with_agent_token(),
                str(self.bin["kfp-persistence-agent"]), f"--kubeconfig={kubeconfig}", f"--namespace={watched}",
                *api, f"--mlPipelineServiceHttpPort={self.http_port}", "--numWorker=2",
            ],
            "kfp-scheduledworkflow": [
                str(self.bin["kfp-scheduledworkflow"]), f"--kubeconfig={kubeconfig}", f"--namespace={watched}",
                *api, f"--metricsPort={procs.free_port()}",
            ],
        }  # fmt: skip
        env = {
            **self._home(),
            "POD_NAMESPACE": NAMESPACE,
            "NAMESPACE": watched,
            "LEADER_ELECTION_DISABLE": "true",
        }
        if self.fast_polling:
            # The controller requeues a running Workflow every 10 s by default (DEFAULT_REQUEUE_TIME, Argo
            # docs/environment-variables.md): each DAG step's hand-over waited up to that. Argo's e2e uses 1 s.
            env["DEFAULT_REQUEUE_TIME"] = FAST_POLLING["DEFAULT_REQUEUE_TIME"]
        for name, argv in commands.items():
            self.procs[name] = procs.Process(name, argv, self.dir / "logs", cwd=self.dir, env=env)
        # Each is up once it has stayed up through its informers' first sync.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for proc in self.procs.values():
                proc.check_alive()
            time.sleep(0.5)
