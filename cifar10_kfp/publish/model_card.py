"""The model card of a published version: ``model_card.json`` (machine-readable) and ``model_card.md``."""

from __future__ import annotations

import json

from cifar10_kfp.publish.bundle import MANIFEST_FILE, TORCHSCRIPT_FILE

CARD_MD = "model_card.md"


def build_card(
    info, *, model_name, version, uri, metrics, dataset_digest, params, run_id, created, model_registry=None
) -> dict:
    import cifar10_kfp

    card = {
        "model_name": model_name,
        "version": version,
        "uri": uri,
        "created": created,
        "kfp_run_id": run_id,
        "code_version": cifar10_kfp.__version__,
        "architecture": info.architecture,
        "model_config": info.model_config,
        "class_names": info.class_names,
        "image_size": info.image_size,
        "normalization": {"mean": info.mean, "std": info.std, "units": "pixel/255"},
        "dataset_digest": dataset_digest,
        "metrics": metrics,
        "parameters": params,
        "files": {
            "weights": "model.safetensors",
            "model_info": "model.json",
            "torchscript": TORCHSCRIPT_FILE,
            "torchscript_input": "uint8 [N, 3, H, W] RGB pixels 0..255; normalization is inside",
            "torchscript_output": "float32 logits [N, num_classes], mean of the image's and its flip's (flip TTA)",
        },
    }
    if model_registry:  # kubeflow_registry: where the version is registered (publish fails if it cannot be)
        card["model_registry"] = model_registry
    return card


def card_markdown(card: dict) -> str:
    from cifar10_kfp.evaluate.report import md_escape

    def rows(mapping):
        return [f"| {md_escape(k)} | {md_escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)} |"
                for k, v in sorted(mapping.items())]  # fmt: skip

    lines = [
        f"# Model card: {md_escape(card['model_name'])} {md_escape(card['version'])}",
        "",
        f"- URI: `{md_escape(card['uri'])}`",
        f"- Created: {md_escape(card['created'])}; KFP run: `{md_escape(card['kfp_run_id'] or '-')}`; "
        f"code version: {md_escape(card['code_version'])}",
        f"- Architecture: `{md_escape(card['architecture'])}`, {len(card['class_names'])} classes, "
        f"{card['image_size']}x{card['image_size']} RGB input",
        f"- Dataset digest: `{md_escape(card['dataset_digest'] or '-')}`",
        f"- Classes: {md_escape(', '.join(card['class_names']))}",
        *_registry_lines(card.get("model_registry")),
        "",
        "## Metrics (test split)",
        "",
        "| metric | value |",
        "|---|---|",
        *rows(card["metrics"]),
        "",
        "## Parameters",
        "",
        "| name | value |",
        "|---|---|",
        *rows(card["parameters"]),
        "",
        "## Use",
        "",
        f"- `{TORCHSCRIPT_FILE}`: TorchScript; input uint8 `[N, 3, H, W]` RGB pixels (0..255), normalization "
        "inside; output float32 logits `[N, num_classes]` with flip TTA (as evaluated).",
        "- Python: `model, preprocess = cifar10_kfp.publish.serving.load_published(URI)`; "
        "CLI: `cifar10-kfp predict --model URI image.jpg`.",
        f"- KServe: `kubectl apply -f {MANIFEST_FILE}` (Triton runtime, v2 protocol).",
        "",
    ]
    return "\n".join(lines)


def _registry_lines(entry: dict | None) -> list[str]:
    from cifar10_kfp.evaluate.report import md_escape

    if not entry:
        return []
    return [
        f"- Kubeflow Model Registry: `{md_escape(entry['uri'])}` at {md_escape(entry['url'])} "
        f"(artifact `{md_escape(entry['artifact_uri'])}`)"
    ]
