"""The training pipeline with the credentials a real Kubeflow install hands out, on the real SeaweedFS.

- A profile namespace's own identity (exactly the profile controller's rights,
  tests/support/kubeflow_profile.py, from kubeflow/pipelines' pipelines-profile-controller/sync.py).
- Standalone KFP's well-known default pair (the ``mlpipeline-minio-artifact`` secret of
  kubeflow/pipelines manifests/kustomize/third-party/seaweedfs): accepted with a warning, refused in strict mode.
"""

from __future__ import annotations

import pytest

from cifar10_kfp.storage import CredentialsError, sha256_file
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from cifar10_kfp_pipelines.local import run_local
from tests.pipelines.test_local import FAST
from tests.support.datagen import make_real_subset_archive
from tests.support.kubeflow_profile import BUCKET, allowed_prefixes, identity_env, profile_identity


@pytest.fixture
def subset(real_archive, tmp_path):
    return make_real_subset_archive(
        real_archive, tmp_path / "subset.tar.gz", train_per_class=20, test_per_class=10
    )


def _use(env: dict, monkeypatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CIFAR10_KFP_PREFIX", raising=False)


@pytest.mark.slow
def test_a_profile_namespace_run_writes_only_where_its_identity_may_publishes_and_reuses_the_cache(
    subset, tmp_path, monkeypatch
):
    identity = profile_identity("team-a")
    with EmbeddedObjectStore(tmp_path / "s3", extra_identities=[identity]) as server:
        _use(identity_env(server, identity, "team-a"), monkeypatch)
        params = {**FAST, "dataset_uri": str(subset), "dataset_checksum": f"sha256:{sha256_file(subset)}",
                  "model_name": "profile-run"}  # fmt: skip
        first = run_local("training", params, output_root=tmp_path / "runs")
        assert first["status"] == "SUCCEEDED", first
        root = "s3://mlpipeline/private/team-a/cifar10-kfp/"
        assert first["published"]["uri"].startswith(f"{root}models/profile-run/")
        written = server.store().list(f"s3://{BUCKET}/")  # listed with the admin identity
        outside = [
            u
            for u in written
            if not any(u.startswith(f"s3://{BUCKET}/{p}") for p in allowed_prefixes("team-a"))
        ]
        assert written and not outside, outside
        assert any(u.startswith(f"{root}runs/{first['run_id']}/") for u in written)  # the run summary too

        subset.unlink()  # the second run can only succeed from the content-addressed copy in the store
        second = run_local("training", params, output_root=tmp_path / "runs")
        assert second["status"] == "SUCCEEDED", second
        assert second["artifacts"]["dataset_archive"] == first["artifacts"]["dataset_archive"]


@pytest.mark.slow
def test_standalone_kfps_default_pair_runs_with_a_warning_and_strict_mode_refuses_it(
    subset, tmp_path, monkeypatch, caplog
):
    with EmbeddedObjectStore(tmp_path / "s3", access_key="minio", secret_key="minio123") as server:
        _use(server.env(), monkeypatch)
        params = {**FAST, "dataset_uri": str(subset), "model_name": "default-pair"}
        summary = run_local("training", params, output_root=tmp_path / "runs")
        assert summary["status"] == "SUCCEEDED", summary
        assert "well-known default credentials" in caplog.text and "rotate" in caplog.text

        monkeypatch.setenv("CIFAR10_KFP_STRICT_CREDENTIALS", "1")
        with pytest.raises(CredentialsError, match="CIFAR10_KFP_STRICT_CREDENTIALS is set"):
            run_local("training", params, output_root=tmp_path / "strict")
        assert not list((tmp_path / "strict").rglob("executor_output.json")), "no task may have run"
