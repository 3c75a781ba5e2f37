"""Where the object store is, who we are on it, and where under it we write. Built from the environment.

On a cluster the ``MINIO_*`` credentials come from the ``mlpipeline-minio-artifact`` secret. In
multi-user Kubeflow that secret holds the namespace's own identity, which may only touch
``mlpipeline/{artifacts, private-artifacts/<ns>, private/<ns>, shared}/*`` (the profile
controller's policy, kubeflow/pipelines ``manifests/kustomize/base/installs/multi-user/
pipelines-profile-controller/sync.py``): so the default prefix follows the namespace, a region is
always set (minio-py would otherwise ask the bucket for its location, which that policy denies),
and nothing here needs bucket-level rights.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cifar10_kfp.storage.names import CredentialsError, validate_bucket
from cifar10_kfp.storage.uri import join_uri

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "mlpipeline"  # exists on every Kubeflow Pipelines install
DEFAULT_PREFIX = "cifar10-kfp/"  # standalone KFP (namespace kubeflow) and local runs
DEFAULT_REGION = "us-east-1"  # SeaweedFS and MinIO accept any region; setting one avoids GetBucketLocation
DEFAULT_RETRY_BUDGET_S = 60.0
# The pair standalone KFP ships in mlpipeline-minio-artifact and every MinIO tutorial uses.
WELL_KNOWN_DEV_CREDENTIALS = ("minio", "minio123")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
KUBEFLOW_NAMESPACE = "kubeflow"  # standalone KFP runs here and writes with the admin identity
# What a Kubeflow profile's identity may write, below the bucket (sync.py's policy resources).
PROFILE_WRITABLE_PREFIXES = (
    "artifacts/",
    "private-artifacts/{namespace}/",
    "private/{namespace}/",
    "shared/",
)

_warned_endpoints: set[str] = set()


def env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def detect_namespace(env: Mapping[str, str] | None = None) -> str:
    """The run's Kubernetes namespace: ``CIFAR10_KFP_NAMESPACE``, else the pod's own; "" when unknown."""
    env = os.environ if env is None else env
    named = env.get("CIFAR10_KFP_NAMESPACE", "").strip()
    if named:
        return named
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return ""


def default_prefix(namespace: str) -> str:
    """``private/<namespace>/cifar10-kfp/`` in a profile namespace, else ``cifar10-kfp/``."""
    if namespace and namespace != KUBEFLOW_NAMESPACE:
        return f"private/{namespace}/{DEFAULT_PREFIX}"
    return DEFAULT_PREFIX


def profile_writable_prefixes(bucket: str, namespace: str) -> list[str]:
    """``bucket/prefix/`` for each place a Kubeflow profile's identity may write."""
    ns = namespace or "<namespace>"
    return [f"{bucket}/{p.format(namespace=ns)}" for p in PROFILE_WRITABLE_PREFIXES]


@dataclass(frozen=True)
class StorageConfig:
    """Where the object store is and how to talk to it. Built from the environment."""

    endpoint: str = ""  # host:port, no scheme; empty means "no object store configured"
    access_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)
    secure: bool = False  # TLS
    region: str = DEFAULT_REGION  # always set: no GetBucketLocation call, which a profile's policy denies
    bucket: str = DEFAULT_BUCKET  # default bucket for keys we derive ourselves
    prefix: str = DEFAULT_PREFIX  # everything we write goes below this prefix
    namespace: str = ""  # the run's namespace, "" when unknown; only named in errors and the prefix
    retry_budget_s: float = DEFAULT_RETRY_BUDGET_S  # total seconds spent retrying one operation
    strict_credentials: bool = False  # refuse WELL_KNOWN_DEV_CREDENTIALS instead of warning

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StorageConfig:
        env = os.environ if env is None else env
        endpoint = env.get("MINIO_ENDPOINT", "").strip()
        secure = env_flag(env.get("MINIO_SECURE"))
        if endpoint.startswith(("http://", "https://")):
            secure = endpoint.startswith("https://")
            endpoint = endpoint.split("://", 1)[1]
        namespace = detect_namespace(env)
        prefix = env.get("CIFAR10_KFP_PREFIX", "").strip().strip("/") or default_prefix(namespace).strip("/")
        return cls(
            endpoint=endpoint.rstrip("/"),
            access_key=env.get("MINIO_ACCESS_KEY", ""),
            secret_key=env.get("MINIO_SECRET_KEY", ""),
            secure=secure,
            region=env.get("MINIO_REGION", "").strip() or DEFAULT_REGION,
            bucket=validate_bucket(env.get("CIFAR10_KFP_BUCKET", DEFAULT_BUCKET)),
            prefix=f"{prefix}/",
            namespace=namespace,
            retry_budget_s=float(env.get("CIFAR10_KFP_RETRY_BUDGET_S", DEFAULT_RETRY_BUDGET_S)),
            strict_credentials=env_flag(env.get("CIFAR10_KFP_STRICT_CREDENTIALS")),
        )

    @property
    def uses_well_known_credentials(self) -> bool:
        return (self.access_key, self.secret_key) == WELL_KNOWN_DEV_CREDENTIALS

    def root_uri(self, *parts: str) -> str:
        """``s3://<bucket>/<prefix>/<parts...>``: the place for everything this project writes."""
        return join_uri(f"s3://{self.bucket}/{self.prefix}", *parts)


def check_credentials(cfg: StorageConfig) -> None:
    """Refuse missing credentials; accept the well-known pair with one warning, or refuse it when strict."""
    if not cfg.access_key or not cfg.secret_key:
        raise CredentialsError(f"MINIO_ACCESS_KEY and MINIO_SECRET_KEY must be set for {cfg.endpoint}")
    if not cfg.uses_well_known_credentials:
        return
    if cfg.strict_credentials:
        raise CredentialsError(
            f"refusing the well-known default credentials of standalone KFP for the object store at {cfg.endpoint} "
            "(CIFAR10_KFP_STRICT_CREDENTIALS is set): rotate them in the object store and in the "
            "mlpipeline-minio-artifact secret"
        )
    if cfg.endpoint not in _warned_endpoints:
        _warned_endpoints.add(cfg.endpoint)
        log.warning(
            "the object store at %s is used with the well-known default credentials of standalone KFP, which "
            "anyone can guess: rotate them (object store and secret mlpipeline-minio-artifact); "
            "CIFAR10_KFP_STRICT_CREDENTIALS=1 refuses them",
            cfg.endpoint,
        )


def root_uri(*parts: str) -> str:
    """The project's root URI under the configured bucket and prefix, joined with ``parts``."""
    return StorageConfig.from_env().root_uri(*parts)
