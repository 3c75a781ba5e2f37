"""SeaweedFS set up as multi-user Kubeflow sets it up: an admin identity and one identity per namespace.

The profile controller (kubeflow/pipelines ``manifests/kustomize/base/installs/multi-user/
pipelines-profile-controller/sync.py``) creates a SeaweedFS user per namespace through the IAM API
and attaches this policy (``iam.put_user_policy``, policy name ``KubeflowProject<ns>``)::

    {"Effect": "Allow", "Action": ["s3:Put*", "s3:Get*", "s3:List*"],
     "Resource": ["arn:aws:s3:::mlpipeline/artifacts/*", "arn:aws:s3:::mlpipeline/private-artifacts/<ns>/*",
                  "arn:aws:s3:::mlpipeline/private/<ns>/*", "arn:aws:s3:::mlpipeline/shared/*"]}

SeaweedFS's IAM API stores such a statement as identity actions in its S3 configuration
(seaweedfs ``weed/iamapi/iamapi_management_handlers.go``: ``s3:Put*`` -> ``Write``, ``s3:Get*`` ->
``Read``, ``s3:List*`` -> ``List``, each on ``<bucket>/<path>``), which is what ``profile_identity``
writes: the same rights, given at start instead of through the API. Nothing on the bucket itself
(HEAD, GetBucketLocation, create) is granted.
"""

from __future__ import annotations

import secrets

BUCKET = "mlpipeline"
PROFILE_PREFIXES = ("artifacts/", "private-artifacts/{ns}/", "private/{ns}/", "shared/")


def allowed_prefixes(namespace: str) -> list[str]:
    return [p.format(ns=namespace) for p in PROFILE_PREFIXES]


def profile_identity(namespace: str) -> dict:
    """A SeaweedFS identity with exactly the profile controller's rights for ``namespace``."""
    resources = [f"{BUCKET}/{prefix}*" for prefix in allowed_prefixes(namespace)]
    return {
        "name": namespace,
        "credentials": [
            {"accessKey": "NS" + secrets.token_hex(8).upper(), "secretKey": secrets.token_urlsafe(30)}
        ],
        "actions": [f"{action}:{resource}" for action in ("Write", "Read", "List") for resource in resources],
    }


def identity_env(server, identity: dict, namespace: str) -> dict[str, str]:
    """The ``MINIO_*`` settings a pipeline step in ``namespace`` gets: the namespace's keys, no prefix."""
    keys = identity["credentials"][0]
    return {**server.env(), "MINIO_ACCESS_KEY": keys["accessKey"], "MINIO_SECRET_KEY": keys["secretKey"],
            "CIFAR10_KFP_NAMESPACE": namespace}  # fmt: skip
