"""``cifar10-kfp publish``: gate a model against the published champion, then publish a new version."""

from __future__ import annotations

import argparse

HELP = "gate a model against the published one (same test data) and publish it as a new version if it wins"

GATE_REFUSED = 3  # exit status when the gate keeps the champion (not an error, but nothing was published)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model directory (model.safetensors + model.json)")
    parser.add_argument(
        "--data", required=True, help="prepared dataset whose test split both models are scored on"
    )
    parser.add_argument(
        "--model-name", required=True, help="publish under <root>/models/<model-name>/<version>/"
    )
    parser.add_argument(
        "--min-accuracy", type=float, default=0.0, help="lowest test accuracy to publish (0..1)"
    )
    parser.add_argument(
        "--run-id", default="", help="run id recorded in the version and card (default: random)"
    )
    parser.add_argument(
        "--bucket", default="", help="object-store bucket (default: CIFAR10_KFP_BUCKET or mlpipeline)"
    )
    parser.add_argument(
        "--prefix",
        default="",
        help="key prefix (default: CIFAR10_KFP_PREFIX, private/<namespace>/cifar10-kfp/ or cifar10-kfp/)",
    )
    parser.add_argument("--service-account", default=None, help="serviceAccountName in the KServe manifest")
    parser.add_argument(
        "--output-dir", default=None, help="also write model_card.md, inference_service.yaml, gate.json here"
    )
    parser.add_argument("--skip-gate", action="store_true", help="publish without comparing to the champion")
    parser.add_argument(
        "--model-registry",
        default="",
        metavar="URL",
        help="also register the version in Kubeflow Model Registry at URL (http(s)://host:port) before "
        "latest moves; token from MODEL_REGISTRY_TOKEN or the pod's service account",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")


def run(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    from cifar10_kfp.evaluate import evaluate_model
    from cifar10_kfp.publish import REGISTRY_MANIFEST_FILE, dataset_digests, publish_model, run_gate
    from cifar10_kfp.storage import open_store

    store = open_store(args.bucket or None, args.prefix or None)
    out = Path(args.output_dir) if args.output_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    evaluation = evaluate_model(args.model, args.data, device=args.device, attribution_per_class=0)
    accuracy = evaluation.accuracy
    gate = {"verdict": "skipped (--skip-gate)", "reason": "published without comparing to the champion"}
    if not args.skip_gate:
        decision = run_gate(
            accuracy,
            args.data,
            min_accuracy=args.min_accuracy,
            model_name=args.model_name,
            store=store,
            device=args.device,
        )
        if out:
            (out / "gate.json").write_text(json.dumps(decision.to_dict(), indent=2))
        if not decision.passed:
            print(json.dumps({"published": False, **decision.to_dict()}, indent=2))
            return GATE_REFUSED
        gate = {"verdict": "passed", "reason": decision.reason}
    digests = dataset_digests(args.data)
    result = publish_model(
        args.model,
        model_name=args.model_name,
        metrics={"test_accuracy": accuracy, "test_accuracy_plain": evaluation.accuracy_plain},
        dataset_digest=digests["prepared_sha256"],
        params={"source_digest": digests["source_digest"]},
        run_id=args.run_id,
        store=store,
        service_account=args.service_account,
        model_registry_url=args.model_registry,
        gate=gate,
        image=os.environ.get("CIFAR10_KFP_IMAGE", ""),  # set in the project's image; empty on a workstation
    )
    if out:
        (out / "model_card.md").write_text(result.card_markdown)
        (out / "inference_service.yaml").write_text(result.inference_service_yaml)
        if result.registration:
            (out / REGISTRY_MANIFEST_FILE).write_text(_registry_manifest(store, result))
    registry = result.registration.get("registry_uri", "")
    print(json.dumps({"published": True, "uri": result.uri, "version": result.version, "test_accuracy": accuracy,
                      **({"model_registry_uri": registry} if registry else {})}))  # fmt: skip
    return 0


def _registry_manifest(store, result) -> str:
    """The version's InferenceService that names its model-registry:// URI (written by publish_model)."""
    from cifar10_kfp.publish import REGISTRY_MANIFEST_FILE
    from cifar10_kfp.storage import join_uri

    return store.get_bytes(join_uri(result.uri, REGISTRY_MANIFEST_FILE)).decode()
