"""``cifar10-kfp evaluate``: test-split metrics, an HTML report and a Markdown summary for a model."""

from __future__ import annotations

import argparse

HELP = "evaluate a model directory on a prepared dataset's test split; write metrics.json, report.html, summary.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="model directory or s3:// URI (model.safetensors + model.json)"
    )
    parser.add_argument("--data", required=True, help="prepared dataset file, its directory, or an s3:// URI")
    parser.add_argument(
        "--history",
        default=None,
        help="history.json for the training curves (default: MODEL/history.json or MODEL/../history.json)",
    )
    parser.add_argument(
        "--output-dir", required=True, help="where metrics.json, report.html and summary.md go"
    )
    parser.add_argument(
        "--no-tta",
        action="store_true",
        help="measure one forward pass instead of the served flip-TTA prediction",
    )
    parser.add_argument("--batch-size", type=int, default=512, help="images per forward pass (default 512)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.evaluate import evaluate_model, write_outputs

    result = evaluate_model(
        args.model,
        args.data,
        tta=not args.no_tta,
        batch_size=args.batch_size,
        history_path=args.history,
        params={"model": args.model, "data": args.data},
        device=args.device,
    )
    paths = write_outputs(result, args.output_dir)
    print(json.dumps({**result.scalars(), **{name: str(path) for name, path in paths.items()}}, indent=2))
    return 0
