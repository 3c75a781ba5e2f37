"""Storage with a Kubeflow profile's own identity on the real SeaweedFS (tests/support/kubeflow_profile.py)."""

from __future__ import annotations

import io

import pytest
from minio import Minio
from minio.error import S3Error

from cifar10_kfp.storage import AccessDeniedError, ObjectStore, StorageConfig
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from cifar10_kfp.storage.probe import probe_access
from tests.support.kubeflow_profile import BUCKET, identity_env, profile_identity


@pytest.fixture(scope="module")
def profile_server(tmp_path_factory):
    identity = profile_identity("team-a")
    with EmbeddedObjectStore(tmp_path_factory.mktemp("profile-s3"), extra_identities=[identity]) as server:
        yield server, identity_env(server, identity, "team-a")


def _raw_client(env: dict, **kwargs) -> Minio:
    return Minio(
        env["MINIO_ENDPOINT"], env["MINIO_ACCESS_KEY"], env["MINIO_SECRET_KEY"], secure=False, **kwargs
    )


def test_the_identity_has_exactly_the_profile_controllers_rights(profile_server):
    """What the issue measured: the namespace's prefixes work; the bucket itself and other prefixes do not."""
    _, env = profile_server
    client = _raw_client(env, region="us-east-1")
    client.put_object(BUCKET, "private/team-a/x", io.BytesIO(b"1"), 1)
    assert client.get_object(BUCKET, "private/team-a/x").read() == b"1"
    assert [o.object_name for o in client.list_objects(BUCKET, prefix="private/team-a/")] == [
        "private/team-a/x"
    ]
    for denied in (
        lambda: client.bucket_exists(BUCKET),
        lambda: client.put_object(BUCKET, "cifar10-kfp/x", io.BytesIO(b"1"), 1),
        lambda: client.put_object(BUCKET, "private/team-b/x", io.BytesIO(b"1"), 1),
        # without a region minio-py first asks the bucket for its location, which is denied
        lambda: _raw_client(env).put_object(BUCKET, "private/team-a/y", io.BytesIO(b"1"), 1),
    ):
        with pytest.raises(S3Error) as err:
            denied()
        assert err.value.code == "AccessDenied"


def test_with_the_namespace_known_everything_lands_under_its_private_prefix(profile_server):
    _, env = profile_server
    store = ObjectStore(StorageConfig.from_env(env))
    assert store.root_uri() == "s3://mlpipeline/private/team-a/cifar10-kfp"
    results = probe_access(store)
    assert [(r.operation, r.ok) for r in results] == [
        ("put", True),
        ("get", True),
        ("list", True),
        ("delete", True),
    ]


def test_access_denied_names_the_key_prefix_and_namespace_and_where_a_profile_may_write(profile_server):
    _, env = profile_server
    store = ObjectStore(StorageConfig.from_env({**env, "CIFAR10_KFP_PREFIX": "cifar10-kfp/"}))
    with pytest.raises(AccessDeniedError) as err:
        store.put_bytes(b"x", store.root_uri("models", "m"))
    message = str(err.value)
    assert "bucket 'mlpipeline'" in message and "key 'cifar10-kfp/models/m'" in message
    assert "prefix in use 'cifar10-kfp/'" in message and "namespace 'team-a'" in message
    assert "mlpipeline/private/team-a/" in message and "mlpipeline/shared/" in message
    assert "MINIO_ACCESS_KEY" not in message and "check" not in message.lower().split("access denied")[0]
    assert env["MINIO_SECRET_KEY"] not in message


def test_doctor_probes_put_get_list_and_delete_under_the_real_prefix(profile_server, monkeypatch):
    from cifar10_kfp_pipelines.commands.doctor import check_storage_access

    _, env = profile_server
    checks = check_storage_access(env)
    assert [(c.name, c.ok) for c in checks] == [
        ("object-store put", True), ("object-store get", True), ("object-store list", True),
        ("object-store delete", True),
    ]  # fmt: skip
    assert all("private/team-a/cifar10-kfp/.doctor/" in c.detail for c in checks)
    refused = check_storage_access({**env, "CIFAR10_KFP_PREFIX": "cifar10-kfp/"})
    assert not any(c.ok for c in refused)
    assert "access denied" in refused[0].detail and "s3://mlpipeline/cifar10-kfp/" in refused[0].detail
