"""The TrainJob manifest: valid by the typed models of kubeflow-trainer-api, named within JobSet's limits,
elastic when asked, with the pod settings a Kubeflow profile namespace needs."""

from __future__ import annotations

import pytest
from kubeflow_trainer_api import models as trainer_models

from cifar10_kfp.train.config import make_config
from cifar10_kfp.trainjob import (
    MAX_JOB_NAME,
    MAX_POD_NAME,
    TrainJobRequest,
    build_trainjob,
    config_arguments,
    job_name,
    job_state,
    longest_pod_name,
    trainer_version_from_crd,
)
from tests.support.k8s_fake_server import condition, trainjob_crd

NS = "team-a"
CONFIG = make_config("fast", {"epochs": 3}).to_dict()


def request(**overrides) -> TrainJobRequest:
    values = dict(
        name=job_name("run-1234", "abc"), namespace=NS, image="ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0",
        data_uri="minio://mlpipeline/v2/artifacts/run/preprocess/dataset", output_uri="s3://mlpipeline/p/trainjobs/x",
        checkpoint_uri="s3://mlpipeline/p/checkpoints/run-1234/abc", config=CONFIG,
        num_nodes=2, gpus_per_node=4, minio_endpoint="seaweedfs.kubeflow:9000",
    )  # fmt: skip
    values.update(overrides)
    return TrainJobRequest(**values)


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_manifest_is_a_valid_trainjob_by_the_typed_models():
    manifest = build_trainjob(request())
    job = trainer_models.TrainerV1alpha1TrainJob.from_dict(manifest)
    assert job.api_version == "trainer.kubeflow.org/v1alpha1" and job.kind == "TrainJob"
    assert job.spec.runtime_ref.name == "torch-distributed"
    trainer = job.spec.trainer
    assert trainer.num_nodes == 2 and trainer.num_proc_per_node == 4
    assert trainer.image == "ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0"
    assert trainer.command[:4] == ["python", "-m", "cifar10_kfp_pipelines.cli", "train"]
    assert _arg(trainer.command, "--nproc") == "4" and _arg(trainer.command, "--upload-to").endswith(
        "/trainjobs/x"
    )
    assert trainer.resources_per_node.limits["nvidia.com/gpu"].actual_instance == "4"
    # credentials come from the secret by reference; no value is in the manifest
    secret_refs = {e.name: e.value_from.secret_key_ref for e in trainer.env if e.value_from}
    assert {k: (r.name, r.key) for k, r in secret_refs.items()} == {
        "MINIO_ACCESS_KEY": ("mlpipeline-minio-artifact", "accesskey"),
        "MINIO_SECRET_KEY": ("mlpipeline-minio-artifact", "secretkey"),
    }
    assert job.to_dict()["spec"]["trainer"]["numNodes"] == 2  # round-trips with the API's field names
    # every node pod runs under the restricted pod-security settings, whatever the runtime says
    (patch,) = job.spec.runtime_patches
    (node,) = patch.training_runtime_spec.template.spec.replicated_jobs
    pod = node.template.spec.template.spec
    assert node.name == "node" and pod.security_context.run_as_non_root is True
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    (container,) = pod.containers
    assert container.name == "node" and container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]


def test_node_pods_get_no_istio_sidecar_shared_memory_and_the_optional_account_and_pull_secrets():
    job = trainer_models.TrainerV1alpha1TrainJob.from_dict(
        build_trainjob(request(service_account="trainer-sa", image_pull_secrets=("regcred", "mirror")))
    )
    template = (
        job.spec.runtime_patches[0]
        .training_runtime_spec.template.spec.replicated_jobs[0]
        .template.spec.template
    )
    assert template.metadata.annotations == {"sidecar.istio.io/inject": "false"}
    assert template.metadata.labels == {"sidecar.istio.io/inject": "false"}
    pod = template.spec
    assert pod.service_account_name == "trainer-sa"
    assert [s.name for s in pod.image_pull_secrets] == ["regcred", "mirror"]
    (volume,) = pod.volumes
    assert volume.name == "dshm" and volume.empty_dir.medium == "Memory"
    assert [(m.name, m.mount_path) for m in pod.containers[0].volume_mounts] == [("dshm", "/dev/shm")]
    # one process per node: no shared-memory volume, and nothing set that was not asked for
    single = build_trainjob(request(gpus_per_node=1))["spec"]["runtimePatches"][0]
    pod_spec = single["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]
    assert "volumes" not in pod_spec["spec"] and "serviceAccountName" not in pod_spec["spec"]
    assert "imagePullSecrets" not in pod_spec["spec"]


def test_cpu_manifest_requests_no_gpu_and_one_process_per_node():
    trainer = trainer_models.TrainerV1alpha1TrainJob.from_dict(
        build_trainjob(request(gpus_per_node=0))
    ).spec.trainer
    assert "nvidia.com/gpu" not in trainer.resources_per_node.limits and trainer.num_proc_per_node == 1


def test_elastic_job_runs_torchrun_min_max_on_node_0s_rendezvous():
    """min_nodes < num_nodes: --nnodes MIN:MAX (torchrun's elastic mode; it wins over the PET_NNODES the
    Trainer sets, and PET_* may not be set in the TrainJob: kubeflow/trainer TorchRunReservedEnvNames)."""
    manifest = build_trainjob(request(num_nodes=4, min_nodes=2, max_restarts=5))
    command, trainer = manifest["spec"]["trainer"]["command"], manifest["spec"]["trainer"]
    assert trainer["numNodes"] == 4
    assert _arg(command, "--nnodes") == "2:4" and _arg(command, "--max-restarts") == "5"
    assert _arg(command, "--rdzv-endpoint") == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert _arg(command, "--rdzv-id") == manifest["metadata"]["name"]
    assert not [e["name"] for e in trainer["env"] if e["name"].startswith("PET_")]
    fixed = build_trainjob(request(num_nodes=3))["spec"]["trainer"]["command"]
    assert _arg(fixed, "--nnodes") == "3"
    with pytest.raises(ValueError, match="min_nodes=5 is out of range"):
        build_trainjob(request(num_nodes=4, min_nodes=5))


@pytest.mark.parametrize("preset", ["seed", "fast", "cpu"])
def test_the_node_command_carries_the_training_config_exactly(preset):
    config = make_config(preset, {"epochs": 7, "lr": 0.0123, "flip": True, "widths": "16,32,64",
                                  "architecture": "fast_resnet", "checkpoint_every_s": 90.5}).to_dict()  # fmt: skip
    args = config_arguments(config)
    assert args[:2] == ["--preset", preset]
    overrides = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--set")
    assert make_config(preset, overrides).to_dict() == config
    assert config_arguments(make_config(preset).to_dict()) == ["--preset", preset]


def test_job_names_fit_jobsets_pod_names_and_stay_unique():
    """JobSet derives pods <job>-node-0-<index>-<5 random> and refuses names over 63 characters
    (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go, placement.GenPodName)."""
    run_ids = ["run-1234", "A_Run/with:odd chars" * 5, "x" * 200, "", "0123-" * 30, "---"]
    names = {job_name(run_id, h) for run_id in run_ids for h in ("", "h1", "h2")}
    assert len(names) == len(run_ids) * 3  # unique per run and config
    for name in names:
        assert len(name) <= MAX_JOB_NAME and name[0].isalpha() and name[-1].isalnum()
        assert all(c.isalnum() and c.islower() or c.isdigit() or c == "-" for c in name)
        longest = longest_pod_name(name, 64)  # the pipeline's num_nodes allows up to 64
        assert len(longest) <= MAX_POD_NAME, longest
    assert job_name("run-1234", "h1") == job_name("run-1234", "h1")
    assert (
        longest_pod_name("cifar10-run-1234-0123456789", 64) == "cifar10-run-1234-0123456789-node-0-63-abcde"
    )


def test_names_and_values_jobset_or_the_trainer_would_refuse_are_refused_first():
    with pytest.raises(ValueError, match="num_nodes=0"):
        build_trainjob(request(num_nodes=0))
    with pytest.raises(ValueError, match="DNS-1035 label of at most 40"):
        build_trainjob(request(name="cifar10-" + "a" * 40))
    with pytest.raises(ValueError, match="longer than 63"):
        build_trainjob(request(name="c" * 40, num_nodes=10**10))
    with pytest.raises(ValueError, match="needs a checkpoint URI"):
        build_trainjob(request(checkpoint_uri=""))


def test_deadline_and_owner_reference():
    manifest = build_trainjob(
        request(active_deadline_s=7200, owner={"name": "run-abc-train-1", "uid": "u-1"})
    )
    assert manifest["spec"]["activeDeadlineSeconds"] == 7200
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "run-abc-train-1", "uid": "u-1"}
    ]
    job = trainer_models.TrainerV1alpha1TrainJob.from_dict(manifest)
    assert job.spec.active_deadline_seconds == 7200 and job.metadata.owner_references[0].uid == "u-1"
    plain = build_trainjob(request())
    assert "activeDeadlineSeconds" not in plain["spec"] and "ownerReferences" not in plain["metadata"]


def test_job_state_reads_conditions():
    assert job_state({}).phase == "Pending"
    assert job_state({"status": {"jobsStatus": [{"name": "node", "active": 2}]}}).phase == "Running"
    failed = job_state(
        {"status": {"conditions": [condition("Failed", reason="DeadlineExceeded", message="too slow")]}}
    )
    assert (failed.phase, failed.reason, failed.message) == ("Failed", "DeadlineExceeded", "too slow")
    assert job_state({"status": {"conditions": [condition("Complete", status="False")]}}).phase == "Pending"


def test_the_trainer_release_is_read_from_the_crd_schema():
    assert trainer_version_from_crd(trainjob_crd("2.2")) == ">=2.2"
    assert trainer_version_from_crd(trainjob_crd("2.1")) == "2.1"
    assert trainer_version_from_crd(trainjob_crd("2.0")) == "2.0"
    assert trainer_version_from_crd({}) == "unknown"
