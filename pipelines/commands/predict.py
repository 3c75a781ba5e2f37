"""``cifar10-kfp predict``: top-k classes of image files with a published model."""

from __future__ import annotations

import argparse
import os

from cifar10_kfp_pipelines.commands import common

HELP = (
    "classify image files with a published model (version URI, .../latest URI, model name, "
    "model-registry://<name>[/<version>] or local dir)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="s3://.../models/<name>/<version>, .../latest, a name, model-registry://<name>[/<version>], or a dir",
    )
    parser.add_argument(
        "--model-registry",
        default=None,
        metavar="URL",
        help="Kubeflow Model Registry for model-registry:// URIs (default: MODEL_REGISTRY_URL)",
    )
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, ...; resized to the model's size)"
    )
    parser.add_argument("--top-k", type=int, default=3, help="classes to print per image (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per image instead of text")
    common.add_local_store_flag(parser, "for a model name or s3:// URI without MINIO_ENDPOINT")


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.publish import load_published, predict_files
    from cifar10_kfp_pipelines.local import object_store_env

    if os.path.isdir(args.model):  # a model directory needs no store
        model, preprocess = load_published(args.model, model_registry_url=args.model_registry)
    else:
        missing = common.missing_local_store(args.data_dir)
        if missing:
            raise ValueError(f"--model {args.model!r} is not a directory and there is {missing}")
        with object_store_env(args.data_dir):
            model, preprocess = load_published(args.model, model_registry_url=args.model_registry)
    for path, top in zip(args.images, predict_files(model, preprocess, args.images, top_k=args.top_k)):
        if args.json:
            print(json.dumps({"image": path, "top_k": [{"class": c, "probability": p} for c, p in top]}))
            continue
        print(path)
        for rank, (name, prob) in enumerate(top, 1):
            print(f"  {rank}. {name:<16} {prob:.4f}")
    return 0
