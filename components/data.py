"""Download and preprocess: the dataset steps of the training pipeline.

``download_dataset`` fetches (or finds in the object store) a verified, content-addressed
archive and outputs a small JSON pointer to it; ``preprocess_dataset`` turns it into the
prepared-dataset file (uint8 images, int64 labels, splits, mean/std). The logic is
``cifar10_kfp.data.download`` and ``cifar10_kfp.data.preprocess``.
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def download_dataset(
    source_uri: str,
    checksum: str,
    bucket: str,
    storage_prefix: str,
    minio_endpoint: str,
    archive: Output[Artifact],
):
    """Fetch a dataset archive once, verify it and store it under its content address.

    Args:
        source_uri: https://, http://, s3://, minio://, file:// URI or path of the official
            CIFAR-10 python archive or of an image-folder archive (.tar, .tar.gz, .tgz, .zip).
        checksum: ``md5:HEX`` or ``sha256:HEX`` to verify; empty for none (the official URL
            is always checked against its published md5).
        bucket: Object-store bucket; empty for ``CIFAR10_KFP_BUCKET`` (default ``mlpipeline``).
        storage_prefix: Key prefix; empty for the configured one (``CIFAR10_KFP_PREFIX`` or the namespace's).
        minio_endpoint: The object store's host:port the pipeline was compiled for (checked against
            ``MINIO_ENDPOINT``); an input so that KFP's cache key, which ignores environment variables,
            changes with it.
        archive: A JSON pointer {source, sha256, size, format, filename, cache_uri} to the
            verified archive in the object store; its metadata adds ``cache_hit``.
    """
    import json

    from cifar10_kfp.data import fetch_dataset
    from cifar10_kfp.runs import report_failures, require_endpoint
    from cifar10_kfp.storage import StorageError, open_store

    report_failures(bucket, storage_prefix)
    store = require_endpoint(open_store(bucket or None, storage_prefix or None), minio_endpoint)
    if not store.config.endpoint:
        raise StorageError(
            "download_dataset needs an object store to pass the archive to the next step: set MINIO_ENDPOINT, "
            "MINIO_ACCESS_KEY and MINIO_SECRET_KEY (on a cluster, from the mlpipeline-minio-artifact secret)"
        )
    result = fetch_dataset(source_uri, checksum, store=store)
    pointer = result.pointer()
    with open(archive.path, "w", encoding="utf-8") as fh:
        json.dump(pointer, fh, indent=1, sort_keys=True)
    archive.metadata.update(pointer)
    archive.metadata["cache_hit"] = result.cache_hit
    print(json.dumps({**pointer, "cache_hit": result.cache_hit}, sort_keys=True))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def preprocess_dataset(
    archive: Input[Artifact],
    val_fraction: float,
    max_train_samples: int,
    max_test_samples: int,
    image_size: int,
    seed: int,
    bucket: str,
    storage_prefix: str,
    minio_endpoint: str,
    dataset: Output[Dataset],
    skip_bad_images: int = 0,
):
    """Decode the verified archive into one prepared-dataset file (safetensors, no pickle).

    Args:
        archive: The pointer written by ``download_dataset``.
        val_fraction: Share of the train split held out for validation, stratified, in [0, 0.5].
        max_train_samples: Stratified subset of the train split (before the val split); 0 = all.
        max_test_samples: Stratified subset of the test split; 0 = all.
        image_size: Output images are image_size x image_size (CIFAR-10 is 32).
        seed: Seed of the subsets and the split; the same seed gives a byte-identical file.
        bucket: Object-store bucket; empty for ``CIFAR10_KFP_BUCKET``.
        storage_prefix: Key prefix; empty for ``CIFAR10_KFP_PREFIX``.
        minio_endpoint: The object store's host:port the pipeline was compiled for (see ``download_dataset``).
        dataset: The prepared dataset (``dataset.safetensors``). Metadata: counts, class_names,
            mean, std, image_size, source_digest, format_version, preprocess_version, cache_uri,
            cache_hit, skipped_images (how many were left out).
        skip_bad_images: 1 leaves out undecodable image-folder images, named in the metadata; 0 fails on one.
    """
    import json

    from cifar10_kfp.data import prepare_to_file
    from cifar10_kfp.runs import report_failures, require_endpoint
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    with open(archive.path, encoding="utf-8") as fh:
        pointer = json.load(fh)
    if not pointer.get("cache_uri"):
        raise ValueError(f"the archive pointer {archive.uri} has no cache_uri; re-run download_dataset")
    store = require_endpoint(open_store(bucket or None, storage_prefix or None), minio_endpoint)
    info = prepare_to_file(
        pointer["cache_uri"],
        dataset.path,
        val_fraction=val_fraction,
        max_train_samples=max_train_samples,
        max_test_samples=max_test_samples,
        image_size=image_size,
        seed=seed,
        skip_bad_images=bool(skip_bad_images),
        source_digest=pointer["sha256"],
        store=store,
    )
    meta = info.metadata
    keys: tuple[str, ...] = (
        "counts",
        "sizes",
        "class_names",
        "mean",
        "std",
        "image_size",
        "source_digest",
        "format_version",
    )
    keys += ("preprocess_version",)
    dataset.metadata.update({key: meta[key] for key in keys})
    dataset.metadata.update(
        source=pointer.get("source", ""),
        source_format=meta.get("source_format", pointer.get("format", "")),
        val_fraction=val_fraction,
        seed=seed,
        cache_uri=info.cache_uri,
        cache_hit=info.cache_hit,
        skipped_images=len(meta.get("skipped_images") or []),
    )
    print(json.dumps({k: dataset.metadata[k] for k in ("sizes", "mean", "std", "cache_hit")}, sort_keys=True))
