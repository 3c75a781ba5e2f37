"""Part 4 (and part of 8): two local pipeline runs at once against one store, one prefix, one output root.

Both runs are the real ``cifar10-kfp run-local`` command (kfp.local, every step its own process),
started together with the suite's recognisable test credentials. They train the *same*
configuration, so the only thing keeping their checkpoints apart is the run id in the prefix;
they publish under two model names, because the publish gate only promotes a challenger that
strictly beats the champion, so two identical models under one name could not both be published.

Checked: separate run ids, checkpoint prefixes and local output roots; each checkpoint prefix
complete and neither run resumed from the other's; each published version present, complete and
holding that run's own trained weights; the shared dataset caches intact. Then the secret scan
(part 8) over everything the runs left: the captured output of both process trees, the command
lines of every process in them, the local artifact metadata, the run summaries, and every object
written to the store with its stored metadata.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cifar10_kfp.train.checkpoint import CheckpointManager
from tests.reliability.harness import CommandLineSampler, Proc, cli_command, scan_for_secret
from tests.support.datagen import make_official_archive

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

EPOCHS = 2


def _run_local_argv(
    archive: Path, digest: str, model_name: str, output_root: Path, summary: Path
) -> list[str]:
    params = {
        "dataset_uri": str(archive),
        "dataset_checksum": digest,
        "preset": "seed",
        "architecture": "simple_cnn",
        "epochs": EPOCHS,
        "num_gpus": 0,
        "min_accuracy": 0.0,
        "model_name": model_name,
    }
    args = ["run-local", "--output-root", str(output_root), "--summary-json", str(summary)]
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    return cli_command(*args)


def test_two_concurrent_local_runs_keep_apart_and_leak_no_secret(
    rel_server, rel_env, rel_store, rel_creds, tmp_path
):
    archive = make_official_archive(tmp_path / "data" / "cifar-10-python.tar.gz", n_per_batch=100)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    output_root = tmp_path / "local_outputs"  # shared on purpose: each run must take its own folder
    names = ("rel-concurrent-a", "rel-concurrent-b")
    procs = [
        Proc(
            _run_local_argv(archive, digest, name, output_root, tmp_path / f"{name}.json"),
            env=rel_env,
            log_path=tmp_path / f"{name}.log",
        )
        for name in names
    ]
    sampler = CommandLineSampler([proc.pid for proc in procs])
    try:
        codes = [proc.wait(420) for proc in procs]
    finally:
        command_lines = sampler.stop()
    for proc, code in zip(procs, codes):
        assert code == 0, f"a concurrent run failed ({code}):\n{proc.output()[-5000:]}"
    summaries = [json.loads((tmp_path / f"{name}.json").read_text()) for name in names]
    assert [s["status"] for s in summaries] == ["SUCCEEDED", "SUCCEEDED"]

    # Separate run ids, checkpoint prefixes and local artifact roots.
    run_ids = {s["run_id"] for s in summaries}
    checkpoints = {s["artifacts"]["checkpoints"] for s in summaries}
    roots = {s["local_root"] for s in summaries}
    assert len(run_ids) == len(checkpoints) == len(roots) == 2, (run_ids, checkpoints, roots)
    for summary in summaries:
        assert summary["run_id"] in summary["artifacts"]["checkpoints"]
        manager = CheckpointManager(summary["artifacts"]["checkpoints"], store=rel_store)
        assert manager.load_latest()["epoch"] == EPOCHS, "a checkpoint prefix is incomplete"
        assert summary["metrics"]["train_resumed_from_epoch"] == 0, (
            "a run resumed from the other run's checkpoint"
        )
        assert Path(summary["local_root"]).is_relative_to(output_root)

    # Both published versions exist, are complete, and each holds its own run's weights.
    from cifar10_kfp.publish.registry import latest_version

    for name, summary in zip(names, summaries):
        published = summary["published"]
        assert published and published["version"].endswith(summary["run_id"]), published
        assert latest_version(name, store=rel_store)["version"] == published["version"]
        card = json.loads(rel_store.get_bytes(f"{published['uri']}/model_card.json"))
        assert card["version"] == published["version"]
        stored = rel_store.get_bytes(f"{published['uri']}/model.safetensors")
        trained = (Path(summary["artifacts"]["model"]) / "model.safetensors").read_bytes()
        assert stored == trained, f"{name}: the published weights are not the ones this run trained"

    # The shared, content-addressed caches hold one verified copy each.
    archives = {s["artifacts"]["dataset_archive"] for s in summaries}
    assert len(archives) == 1 and rel_store.stat(archives.pop()).sha256 == digest
    prepared = {s["artifacts"]["prepared_dataset_cache"] for s in summaries}
    assert len(prepared) == 1 and rel_store.exists(prepared.pop())

    # Part 8: no trace of the secret anywhere these runs wrote or printed.
    prefix_uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}"
    uris = rel_store.list(prefix_uri)
    objects = [rel_store.get_bytes(uri, verify=False) for uri in uris]
    assert len(objects) > 10
    object_metadata = []  # the user metadata (x-amz-meta-*) stored with each object
    for uri in uris:
        bucket, key = uri[len("s3://") :].split("/", 1)
        meta = rel_store.client.stat_object(bucket, key).metadata
        object_metadata.append(json.dumps({k: v for k, v in meta.items()}).encode())
    assert len(command_lines) >= 2 * len(procs), "the sampler saw too few processes to mean anything"
    hits = scan_for_secret(rel_creds, "local run logs (whole process tree)", [p.log_path for p in procs])
    hits += scan_for_secret(rel_creds, "artifact metadata (kfp.local outputs)", [output_root])
    hits += scan_for_secret(rel_creds, "run summaries", [tmp_path / f"{name}.json" for name in names])
    hits += scan_for_secret(rel_creds, "objects written to the store", objects)
    hits += scan_for_secret(rel_creds, "object metadata in the store", object_metadata)
    hits += scan_for_secret(rel_creds, "process command lines", command_lines)
    assert not hits, hits
    # The scan can see: the access key is in the environment the runs were given, and the store saw it.
    assert rel_creds.access_key not in "".join(p.output() for p in procs), "the access key was printed"
