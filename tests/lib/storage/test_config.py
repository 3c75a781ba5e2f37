"""Storage settings from the environment: the namespace's prefix, the region, the well-known credentials."""

from __future__ import annotations

import logging

import pytest

from cifar10_kfp.storage import CredentialsError, ObjectStore, StorageConfig, open_store
from cifar10_kfp.storage import config as storage_config

STANDALONE_KFP_PAIR = {"MINIO_ACCESS_KEY": "minio", "MINIO_SECRET_KEY": "minio123"}  # standalone KFP's secret


@pytest.fixture(autouse=True)
def _no_pod_namespace(monkeypatch, tmp_path):
    """Tests decide the pod's namespace file; this machine's (if any) never leaks in."""
    monkeypatch.setattr(storage_config, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "no-such-namespace-file")
    storage_config._warned_endpoints.clear()


@pytest.mark.parametrize(
    ("env", "prefix", "namespace"),
    [
        ({}, "cifar10-kfp/", ""),
        ({"CIFAR10_KFP_NAMESPACE": "team-a"}, "private/team-a/cifar10-kfp/", "team-a"),
        (
            {"CIFAR10_KFP_NAMESPACE": "kubeflow"},
            "cifar10-kfp/",
            "kubeflow",
        ),  # standalone KFP: the admin identity
        ({"CIFAR10_KFP_NAMESPACE": "team-a", "CIFAR10_KFP_PREFIX": "shared/x"}, "shared/x/", "team-a"),
    ],
)
def test_the_default_prefix_follows_the_runs_namespace(env, prefix, namespace):
    config = StorageConfig.from_env(env)
    assert (config.prefix, config.namespace) == (prefix, namespace)
    assert config.root_uri("models") == f"s3://mlpipeline/{prefix}models"


def test_the_namespace_comes_from_the_pods_service_account_when_not_named(monkeypatch, tmp_path):
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("team-b\n")
    monkeypatch.setattr(storage_config, "SERVICE_ACCOUNT_NAMESPACE", namespace_file)
    assert StorageConfig.from_env({}).prefix == "private/team-b/cifar10-kfp/"
    assert StorageConfig.from_env({"CIFAR10_KFP_NAMESPACE": "team-c"}).namespace == "team-c"


def test_the_storage_prefix_parameter_overrides_everything(monkeypatch):
    monkeypatch.setenv("CIFAR10_KFP_NAMESPACE", "team-a")
    assert open_store(prefix="private/team-a/elsewhere").config.prefix == "private/team-a/elsewhere/"
    assert open_store().config.prefix == "private/team-a/cifar10-kfp/"


def test_a_region_is_always_set_so_the_bucket_is_never_asked_for_its_location():
    assert StorageConfig.from_env({}).region == "us-east-1"
    assert StorageConfig.from_env({"MINIO_REGION": "eu-west-3"}).region == "eu-west-3"


def test_the_well_known_pair_is_accepted_with_one_warning(caplog):
    env = {"MINIO_ENDPOINT": "127.0.0.1:9", **STANDALONE_KFP_PAIR}
    with caplog.at_level(logging.WARNING):
        assert ObjectStore(StorageConfig.from_env(env)).client is not None
        assert ObjectStore(StorageConfig.from_env(env)).client is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "well-known default credentials" in warnings[0] and "rotate" in warnings[0]
    assert "minio123" not in caplog.text


def test_strict_mode_refuses_the_well_known_pair():
    env = {"MINIO_ENDPOINT": "127.0.0.1:9", **STANDALONE_KFP_PAIR, "CIFAR10_KFP_STRICT_CREDENTIALS": "1"}
    with pytest.raises(CredentialsError, match="CIFAR10_KFP_STRICT_CREDENTIALS is set") as err:
        ObjectStore(StorageConfig.from_env(env)).client  # noqa: B018 - building the client is the check
    assert "minio123" not in str(err.value)
    other = {**env, "MINIO_SECRET_KEY": "a-rotated-secret"}
    assert ObjectStore(StorageConfig.from_env(other)).client is not None
