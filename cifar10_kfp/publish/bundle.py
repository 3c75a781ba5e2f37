"""The serving bundle of a published version: TorchScript program, Triton repository, KServe manifest.

Files a version holds besides its weights and card (``cifar10_kfp.publish``)::

    <version>/model.torchscript.pt                    TorchScript: RAW uint8 input, flip-TTA logits out
             /triton/<name>/config.pbtxt, 1/model.pt  Triton (libtorch backend) model repository
             /inference_service.yaml                  KServe InferenceService for this version

The TorchScript program takes **raw uint8 images** ``[N, 3, H, W]`` (0..255, RGB) and returns
the **logits** ``[N, num_classes]`` of ``cifar10_kfp.train.inference.predict``: normalisation with the
model's mean/std and flip TTA happen inside, so a client sends pixels and gets exactly what the
evaluation measured (docs/evaluation.md). Only ``export_torchscript`` and ``stage_bundle`` import
torch, so that the gate, which only reads the ``latest`` pointer when nothing is published yet,
does not pay for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

from cifar10_kfp.publish.registry import PublishError

TORCHSCRIPT_FILE = "model.torchscript.pt"
MANIFEST_FILE = "inference_service.yaml"
TORCHSCRIPT_ATOL = 1e-4  # max |scripted - eager| logit difference accepted before publishing
DEFAULT_SERVICE_ACCOUNT = (
    "cifar10-kfp-serving"  # must carry the S3 endpoint/credential annotations KServe reads
)
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"


def raw_image_classifier(model, info):
    """``model`` wrapped to take raw uint8 ``[N, 3, H, W]`` pixels and return served (flip-TTA) logits."""
    from torch import nn

    from cifar10_kfp.train.inference import SERVED_TTA, Normalize, predict

    class RawImageClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.normalize = Normalize(info.mean, info.std)
            self.model = model

        def forward(self, images):
            return predict(self.model, self.normalize(images), tta=SERVED_TTA)

    return RawImageClassifier().eval()


def export_torchscript(model, info, path: str | os.PathLike) -> Path:
    """Trace the raw-image classifier on CPU, save it, and check it against the eager model."""
    import torch

    wrapped = raw_image_classifier(model.cpu().eval(), info)
    generator = torch.Generator().manual_seed(0)
    size = info.image_size
    example = torch.randint(0, 256, (4, 3, size, size), dtype=torch.uint8, generator=generator)
    with warnings.catch_warnings():
        # TorchScript is deprecated in favour of torch.export, but it is what Triton's libtorch
        # backend (KServe's PyTorch runtime) loads.
        warnings.simplefilter("ignore", FutureWarning)
        with torch.no_grad():
            # check_trace=False: the check below replaces trace's own re-run check, with another
            # batch size and fresh inputs; trace's check also imports torch.distributed.tensor
            # (~0.4 s of every publish task).
            traced = torch.jit.trace(wrapped, example, check_trace=False)
            check = torch.randint(0, 256, (3, 3, size, size), dtype=torch.uint8, generator=generator)
            diff = (traced(check) - wrapped(check)).abs().max().item()
        if diff > TORCHSCRIPT_ATOL:
            raise PublishError(
                f"TorchScript output differs from the eager model by {diff:g} (> {TORCHSCRIPT_ATOL})"
            )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(traced, str(path))
    return path


def triton_config(name: str, info, max_batch_size: int = 256) -> str:
    """``config.pbtxt`` for Triton's libtorch backend: uint8 [3, H, W] in, float32 logits out."""
    return (
        f'name: "{name}"\n'
        'platform: "pytorch_libtorch"\n'
        f"max_batch_size: {max_batch_size}\n"
        f'input [ {{ name: "INPUT__0" data_type: TYPE_UINT8 dims: [ 3, {info.image_size}, {info.image_size} ] }} ]\n'
        f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {info.num_classes} ] }} ]\n'
    )


def stage_bundle(model, info, staging: Path, *, isvc_name: str, manifest_text: str) -> None:
    """Write the TorchScript program, its Triton repository and the KServe manifest into ``staging``."""
    export_torchscript(model, info, staging / TORCHSCRIPT_FILE)
    triton_dir = staging / "triton" / isvc_name
    (triton_dir / "1").mkdir(parents=True)
    shutil.copyfile(staging / TORCHSCRIPT_FILE, triton_dir / "1" / "model.pt")
    (triton_dir / "config.pbtxt").write_text(triton_config(isvc_name, info))
    (staging / MANIFEST_FILE).write_text(manifest_text)


# ---------------------------------------------------------------------------- KServe


def serving_name(model_name: str) -> str:
    """A KServe-safe InferenceService name (DNS-1035 label, short enough for generated service names)."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:40].rstrip("-")


def inference_service_manifest(
    name: str,
    storage_uri: str,
    *,
    service_account: str | None = None,
    namespace: str | None = None,
    labels: dict | None = None,
) -> dict:
    """A KServe ``InferenceService`` serving the TorchScript program with the Triton runtime (v2 protocol).

    ``storage_uri`` points at a Triton model repository (``<version>/triton``). No credentials: KServe
    reads the S3 endpoint and keys from the secret attached to ``service_account``.
    """
    if not storage_uri:
        raise ValueError("storage_uri must not be empty")
    metadata = {
        "name": serving_name(name),
        "labels": {
            "app.kubernetes.io/part-of": "cifar10-kfp",
            **{k: str(v) for k, v in (labels or {}).items()},
        },
        "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {
            "predictor": {
                "serviceAccountName": service_account or DEFAULT_SERVICE_ACCOUNT,
                "model": {
                    "modelFormat": {"name": "pytorch"},
                    "runtime": "kserve-tritonserver",
                    "protocolVersion": "v2",
                    "storageUri": storage_uri.replace("minio://", "s3://", 1),
                    "resources": {
                        "requests": {"cpu": "1", "memory": "2Gi"},
                        "limits": {"cpu": "2", "memory": "4Gi"},
                    },
                },
            }
        },
    }


def manifest_yaml(manifest: dict) -> str:
    """YAML text for a manifest (PyYAML ships with kfp); JSON, which is valid YAML, without it."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - kfp depends on PyYAML
        return json.dumps(manifest, indent=2) + "\n"
    return yaml.safe_dump(manifest, sort_keys=False)
