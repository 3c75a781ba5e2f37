"""One small storage API over S3-compatible object stores and the local filesystem.

Configuration comes from the environment (on a cluster, the ``MINIO_*`` credentials are fed from
the ``mlpipeline-minio-artifact`` secret):

===================================  =========================================================
``MINIO_ENDPOINT``                   ``host:port`` (KFP >= 2.15: ``seaweedfs.kubeflow:9000``)
``MINIO_ACCESS_KEY``                 access key
``MINIO_SECRET_KEY``                 secret key
``MINIO_SECURE``                     ``true`` for TLS (default ``false``)
``MINIO_REGION``                     region (default ``us-east-1``; never asked of the bucket)
``CIFAR10_KFP_BUCKET``               default bucket (default ``mlpipeline``)
``CIFAR10_KFP_NAMESPACE``            the run's namespace (default: the pod's own, if any)
``CIFAR10_KFP_PREFIX``               prefix for everything we write (default
                                     ``private/<namespace>/cifar10-kfp/`` in a profile namespace,
                                     else ``cifar10-kfp/``)
``CIFAR10_KFP_RETRY_BUDGET_S``       seconds to keep retrying transient failures (default 60)
``CIFAR10_KFP_STRICT_CREDENTIALS``   ``1`` refuses the well-known ``minio``/``minio123`` pair
                                     (by default it is accepted with one warning)
===================================  =========================================================

Modules: ``names`` (errors, bucket and key rules), ``uri`` (locations), ``config`` (settings,
namespace and prefix, credentials), ``retry`` (backoff and error explanations), ``store``
(``ObjectStore``), ``probe`` (what the credentials may do), ``embedded`` (a real SeaweedFS on
127.0.0.1 for tests, ``run-local`` and notebooks; loaded on first use).
"""

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports
from cifar10_kfp.storage.config import (
    DEFAULT_BUCKET,
    DEFAULT_PREFIX,
    DEFAULT_REGION,
    WELL_KNOWN_DEV_CREDENTIALS,
    StorageConfig,
    check_credentials,
    default_prefix,
    detect_namespace,
    profile_writable_prefixes,
    root_uri,
)
from cifar10_kfp.storage.names import (
    AccessDeniedError,
    CredentialsError,
    IntegrityError,
    InvalidNameError,
    ObjectNotFound,
    StorageError,
    validate_bucket,
    validate_key,
)
from cifar10_kfp.storage.probe import ProbeResult, probe_access
from cifar10_kfp.storage.store import SHA256_META, ObjectInfo, ObjectStore, open_store, sha256_file
from cifar10_kfp.storage.uri import Location, is_remote, join_uri, parse_uri

if TYPE_CHECKING:
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore, serve_forever

__all__ = [
    "DEFAULT_BUCKET", "DEFAULT_PREFIX", "DEFAULT_REGION", "SHA256_META", "WELL_KNOWN_DEV_CREDENTIALS",
    "AccessDeniedError", "CredentialsError", "IntegrityError", "InvalidNameError", "Location", "ObjectInfo",
    "ObjectNotFound", "ObjectStore", "StorageConfig", "StorageError", "check_credentials", "default_prefix",
    "detect_namespace", "is_remote", "join_uri", "open_store", "parse_uri", "profile_writable_prefixes",
    "root_uri", "sha256_file", "validate_bucket", "validate_key",
    "EmbeddedObjectStore", "ProbeResult", "probe_access", "serve_forever",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
