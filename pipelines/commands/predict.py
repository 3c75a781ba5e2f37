"""``cifar10-kfp predict``: top-k classes of image files with a published model."""

from __future__ import annotations

import argparse

HELP = "classify image files with a published model (version URI, .../latest URI, model name or local dir)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="s3://.../models/<name>/<version>, .../latest, a name, or a dir"
    )
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, ...; resized to the model's size)"
    )
    parser.add_argument("--top-k", type=int, default=3, help="classes to print per image (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per image instead of text")


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.publish import load_published, predict_files

    model, preprocess = load_published(args.model)
    for path, top in zip(args.images, predict_files(model, preprocess, args.images, top_k=args.top_k)):
        if args.json:
            print(json.dumps({"image": path, "top_k": [{"class": c, "probability": p} for c, p in top]}))
            continue
        print(path)
        for rank, (name, prob) in enumerate(top, 1):
            print(f"  {rank}. {name:<16} {prob:.4f}")
    return 0
