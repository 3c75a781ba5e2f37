"""The download_dataset and preprocess_dataset components: ``.python_func``, a kfp.local run, the spec."""

import json
import os
from pathlib import Path

import pytest
from kfp import dsl

from cifar10_kfp.data.format import load_prepared, read_metadata
from cifar10_kfp_components.data import download_dataset, preprocess_dataset
from tests.support.datagen import (
    LocalHTTPServer,
    file_digest,
    make_image_folder_archive,
    make_official_archive,
    small_image_folder,
)
from tests.support.paths import ROOT

PREPROCESS_ARGS = dict(val_fraction=0.1, max_train_samples=200, max_test_samples=50, image_size=32, seed=0)


@pytest.fixture(scope="module")
def official_archive(tmp_path_factory):
    return make_official_archive(
        tmp_path_factory.mktemp("official") / "cifar-10-python.tar.gz", n_per_batch=60
    )


def _run_both(tmp_path: Path, url: str, checksum: str, run: str):
    store = {"bucket": "", "storage_prefix": "", "minio_endpoint": os.environ["MINIO_ENDPOINT"]}
    archive = dsl.Artifact(uri=str(tmp_path / run / "archive"), metadata={})
    dataset = dsl.Dataset(uri=str(tmp_path / run / "dataset"), metadata={})
    Path(archive.path).parent.mkdir(parents=True, exist_ok=True)
    download_dataset.python_func(source_uri=url, checksum=checksum, **store, archive=archive)
    preprocess_dataset.python_func(archive=archive, **PREPROCESS_ARGS, **store, dataset=dataset)
    return archive, dataset


def test_components_with_real_artifacts(store_env, official_archive, tmp_path):
    sha256 = file_digest(official_archive)
    with LocalHTTPServer() as server:
        url = server.add_file("cifar-10-python.tar.gz", official_archive)
        archive, dataset = _run_both(tmp_path, url, f"md5:{file_digest(official_archive, 'md5')}", "first")
        again_archive, again_dataset = _run_both(tmp_path, url, f"sha256:{sha256}", "second")
        assert server.fetches("cifar-10-python.tar.gz") == 1

    pointer = json.loads(Path(archive.path).read_text())
    assert pointer == {k: archive.metadata[k] for k in pointer}
    assert pointer["sha256"] == sha256 and pointer["format"] == "cifar10-python"
    assert pointer["cache_uri"] == store_env.root_uri("datasets", "sha256", sha256, "cifar-10-python.tar.gz")
    assert archive.metadata["cache_hit"] is False and again_archive.metadata["cache_hit"] is True

    meta = dataset.metadata
    assert meta["sizes"] == {"train": 180, "val": 20, "test": 50}
    assert meta["class_names"][0] == "airplane" and len(meta["mean"]) == len(meta["std"]) == 3
    assert meta["source_digest"] == sha256 and meta["format_version"] == 1 and meta["image_size"] == 32
    assert meta["preprocess_version"] == 1
    assert meta["cache_hit"] is False and again_dataset.metadata["cache_hit"] is True
    assert meta["cache_uri"].startswith(store_env.root_uri("prepared", sha256[:16]))
    assert Path(dataset.path).read_bytes() == Path(again_dataset.path).read_bytes()
    assert read_metadata(dataset.path)["counts"] == meta["counts"]
    json.dumps(meta)  # the UI metadata is plain JSON


def test_preprocess_component_skips_undecodable_images_only_when_asked(store_env, tmp_path):
    files = small_image_folder(per_class=3)
    files["data/test/dog/broken.png"] = b"not a png"
    path = make_image_folder_archive(tmp_path / "folder.tar.gz", files)
    store = {"bucket": "", "storage_prefix": "", "minio_endpoint": os.environ["MINIO_ENDPOINT"]}
    archive = dsl.Artifact(uri=str(tmp_path / "archive"), metadata={})
    download_dataset.python_func(source_uri=str(path), checksum="", **store, archive=archive)
    args = dict(PREPROCESS_ARGS, val_fraction=0.0, max_train_samples=0, max_test_samples=0)
    refused = dsl.Dataset(uri=str(tmp_path / "refused"), metadata={})
    with pytest.raises(ValueError, match="cannot decode image data/test/dog/broken.png"):
        preprocess_dataset.python_func(archive=archive, **args, **store, dataset=refused)
    dataset = dsl.Dataset(uri=str(tmp_path / "skipped"), metadata={})
    preprocess_dataset.python_func(archive=archive, **args, **store, dataset=dataset, skip_bad_images=1)
    assert dataset.metadata["skipped_images"] == 1 and dataset.metadata["sizes"]["test"] == 6
    assert [s["name"] for s in read_metadata(dataset.path)["skipped_images"]] == ["data/test/dog/broken.png"]


def test_download_component_needs_an_object_store(official_archive, tmp_path, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    archive = dsl.Artifact(uri=str(tmp_path / "archive"), metadata={})
    with pytest.raises(RuntimeError, match="needs an object store"):
        download_dataset.python_func(
            source_uri=str(official_archive),
            checksum="",
            bucket="",
            storage_prefix="",
            minio_endpoint="",
            archive=archive,
        )


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")
def test_download_then_preprocess_under_kfp_local(store_env, official_archive, tmp_path, monkeypatch):
    from kfp import local

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

    @dsl.pipeline(name="data-steps")
    def data_steps(source_uri: str, checksum: str, minio_endpoint: str):
        store = {"bucket": "", "storage_prefix": "", "minio_endpoint": minio_endpoint}
        download = download_dataset(source_uri=source_uri, checksum=checksum, **store)
        preprocess_dataset(
            archive=download.outputs["archive"], **PREPROCESS_ARGS, **store
        ).set_caching_options(False)
        download.set_caching_options(False)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp-root"))
    with LocalHTTPServer() as server:
        url = server.add_file("cifar-10-python.tar.gz", official_archive)
        data_steps(
            source_uri=url,
            checksum=f"sha256:{file_digest(official_archive)}",
            minio_endpoint=store_env.config.endpoint,
        )
        assert server.fetches("cifar-10-python.tar.gz") == 1
    files = [p for p in (tmp_path / "kfp-root").rglob("dataset") if p.is_file()]
    assert len(files) == 1
    prepared = load_prepared(files[0])
    assert (len(prepared.train_labels), len(prepared.val_labels), len(prepared.test_labels)) == (180, 20, 50)
    assert prepared.source_digest == file_digest(official_archive)
    assert store_env.list(store_env.root_uri("prepared") + "/")


def test_component_specs(tmp_path):
    import yaml
    from kfp import compiler

    from cifar10_kfp_components.image import IMAGE

    for component in (download_dataset, preprocess_dataset):
        path = tmp_path / f"{component.name}.yaml"
        compiler.Compiler().compile(component, str(path))
        spec = yaml.safe_load(path.read_text())
        executor = next(iter(spec["deploymentSpec"]["executors"].values()))["container"]
        assert executor["image"] == IMAGE
        assert "pip install" not in " ".join(executor["command"])  # install_kfp_package=False
        assert "import cifar10_kfp" not in " ".join(executor["command"]).split("def ")[0]
    inputs = yaml.safe_load((tmp_path / "preprocess-dataset.yaml").read_text())["root"]["inputDefinitions"]
    assert set(inputs["parameters"]) == {
        "val_fraction", "max_train_samples", "max_test_samples", "image_size", "seed", "bucket", "storage_prefix",
        "minio_endpoint", "skip_bad_images",
    }  # fmt: skip
    assert inputs["artifacts"]["archive"]["artifactType"]["schemaTitle"] == "system.Artifact"
