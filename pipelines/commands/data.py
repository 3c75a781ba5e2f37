"""``cifar10-kfp data``: download (verified, cached) and preprocess a dataset into one file."""

from __future__ import annotations

import argparse

from cifar10_kfp.data import CIFAR10_URL, MAX_VAL_FRACTION  # light: constants, no torch

HELP = (
    "download, verify and preprocess a dataset (official CIFAR-10 or an image-folder archive) into one file"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        default=CIFAR10_URL,
        metavar="URI",
        help="https://, s3://, minio://, file:// URI or path of the archive (default: the official CIFAR-10 URL)",
    )
    parser.add_argument(
        "--checksum",
        default="",
        metavar="ALGO:HEX",
        help="md5:HEX or sha256:HEX to verify (the official URL is always checked against its md5)",
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.1,
        help=f"stratified validation share of the train split, in [0, {MAX_VAL_FRACTION:g}] (the pipeline's rule)",
    )  # fmt: skip
    parser.add_argument(
        "--max-train-samples", type=int, default=0, metavar="N", help="stratified train subset; 0 = all"
    )
    parser.add_argument(
        "--max-test-samples", type=int, default=0, metavar="N", help="stratified test subset; 0 = all"
    )
    parser.add_argument(
        "--image-size", type=int, default=32, metavar="S", help="output images are S x S (default 32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the subsets and the split")
    parser.add_argument(
        "--skip-bad-images", action="store_true",
        help="leave out image-folder images that cannot be decoded, listing them (default: the first one fails, "
        "naming it)",
    )  # fmt: skip
    parser.add_argument("--output", required=True, metavar="PATH", help="where to write dataset.safetensors")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="neither read nor write the object-store caches (always fetch)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _format_summary(summary: dict, cache: str) -> str:
    sizes, counts = summary["sizes"], summary["counts"]
    lines = [
        f"source      {summary['source']} ({summary['format']}, sha256 {summary['sha256'][:16]}...)",
        f"classes     {len(summary['class_names'])}: {', '.join(summary['class_names'])}",
        f"images      train {sizes['train']}, val {sizes['val']}, test {sizes['test']} "
        f"({summary['image_size']}x{summary['image_size']})",
        "per class   "
        + "; ".join(
            f"{split} {min(c.values(), default=0)}-{max(c.values(), default=0)}"
            for split, c in counts.items()
        ),
        "mean        " + ", ".join(f"{x:.4f}" for x in summary["mean"]),
        "std         " + ", ".join(f"{x:.4f}" for x in summary["std"]),
    ]
    if cache == "no-store":
        lines.append(
            "cache       off: no object store configured (set MINIO_ENDPOINT or run `cifar10-kfp store`)"
        )
    elif cache == "disabled":
        lines.append("cache       off: --no-cache")
    else:
        download = "hit (nothing fetched)" if summary["download_cache_hit"] else "miss (fetched and stored)"
        prepared = "hit (nothing decoded)" if summary["prepared_cache_hit"] else "miss (decoded and stored)"
        lines.append(f"cache       archive {download}; prepared {prepared}")
    skipped = summary.get("skipped_images") or []
    if skipped:
        lines.append(f"skipped     {len(skipped)} undecodable image(s) (--skip-bad-images):")
        lines += [f"              {item['name']}: {item['error']}" for item in skipped[:20]]
        lines += (
            [f"              ... and {len(skipped) - 20} more (--json lists all)"]
            if len(skipped) > 20
            else []
        )
    lines.append(f"output      {summary['output']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.data import prepare_from_source
    from cifar10_kfp.storage import open_store

    store = open_store()
    cache = "disabled" if args.no_cache else ("on" if store.config.endpoint else "no-store")
    result = prepare_from_source(
        args.source,
        args.checksum,
        args.output,
        val_fraction=args.val_fraction,
        max_train_samples=args.max_train_samples,
        max_test_samples=args.max_test_samples,
        image_size=args.image_size,
        seed=args.seed,
        skip_bad_images=args.skip_bad_images,
        store=store,
        cache=not args.no_cache,
    )
    summary = dict(result.summary(), output=str(args.output))
    print(json.dumps(summary, indent=2, sort_keys=True) if args.json else _format_summary(summary, cache))
    return 0
