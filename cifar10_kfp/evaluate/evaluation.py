"""Evaluate a model directory on the test split of a prepared dataset.

The whole test split goes to the device once as uint8 (airbench style) and is normalized
there batch by batch with the *model's* mean/std (``ModelInfo``), so evaluation does not
depend on how the dataset file was normalized. Reported:

- ``accuracy``: the headline: top-1 of what the served model returns (``inference.predict``:
  with ``tta``, the default, the mean of the logits of the image and of its horizontal flip).
  The publish gate, the run summary's ``test_accuracy``, the KFP UI and the report use it.
- ``accuracy_plain``: top-1 of one forward pass on the unflipped image, for comparison.
- ``loss``: mean cross-entropy of the plain predictions.
- per-class precision, recall, F1 and support; macro F1; the confusion matrix
  (rows = true class, columns = predicted class).

``report.write_outputs`` turns an ``EvalResult`` into ``metrics.json``, ``report.html`` and ``summary.md``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from cifar10_kfp.evaluate.attribution import PER_CLASS as ATTRIBUTION_PER_CLASS  # the report grid's default
from cifar10_kfp.evaluate.attribution import attribution_grid
from cifar10_kfp.train.inference import SERVED_TTA, Normalize, predict_with_single_view

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.train.models import ModelInfo

log = logging.getLogger(__name__)

MAX_MISCLASSIFIED = 32  # images kept for the report grid: enough to see patterns, small enough for the UI


@dataclass
class EvalResult:
    """Test-split metrics for one model on one dataset."""

    accuracy: float  # headline: top-1 as served (flip TTA unless tta=False), in [0, 1]
    accuracy_plain: float  # top-1 of a single forward pass on the unflipped images
    tta: bool  # whether ``accuracy`` averages the logits of x and flip(x), as a published model does
    loss: float  # mean cross-entropy of the served predictions, nats
    macro_f1: float  # unweighted mean of the per-class F1
    num_examples: int  # test images evaluated
    class_names: list[str]
    per_class: dict[str, dict[str, float]]  # name -> precision, recall, f1, support
    confusion_matrix: list[list[int]]  # [true][predicted] counts
    misclassified: list[dict] = field(default_factory=list)  # index, true, predicted, confidence (test order)
    history: list[dict] = field(default_factory=list)  # per-epoch training history (history.json)
    params: dict = field(default_factory=dict)  # run parameters shown in the report
    model_summary: dict = field(default_factory=dict)  # architecture, image size, normalization, ...
    dataset_summary: dict = field(default_factory=dict)  # sizes, digest, test counts per class
    # uint8 [K, 3, H, W] images of ``misclassified``, for the report only (not serialized)
    misclassified_images: np.ndarray | None = field(default=None, repr=False)
    # attribution maps of a grid of test images (cifar10_kfp.evaluate.attribution), for the report only
    attribution: object | None = field(default=None, repr=False)
    attribution_note: str = ""  # why there are no maps, when there are none

    def metrics(self) -> dict:
        """The JSON-serializable part: what ``metrics.json`` holds."""
        out = asdict(self)
        out.pop("misclassified_images")
        out.pop("attribution")
        return out

    def scalars(self) -> dict[str, float]:
        """Scalar metrics for KFP ``Metrics``: ``accuracy`` is the headline (as served)."""
        return {
            "accuracy": self.accuracy,
            "accuracy_plain": self.accuracy_plain,
            "loss": self.loss,
            "macro_f1": self.macro_f1,
            "num_examples": float(self.num_examples),
        }


# ------------------------------------------------------------------------ pure metrics


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """``[true, predicted]`` counts as int64 ``[num_classes, num_classes]``."""
    labels = np.asarray(labels, dtype=np.int64)
    predictions = np.asarray(predictions, dtype=np.int64)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ in shape")
    for name, arr in (("labels", labels), ("predictions", predictions)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise ValueError(f"{name} outside [0, {num_classes}): min {arr.min()}, max {arr.max()}")
    flat = labels * num_classes + predictions
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def per_class_metrics(matrix: np.ndarray, class_names: list[str]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support per class from a confusion matrix; 0/0 counts as 0."""
    matrix = np.asarray(matrix, dtype=np.float64)
    true_pos = np.diag(matrix)
    predicted = matrix.sum(axis=0)
    actual = matrix.sum(axis=1)
    out = {}
    for i, name in enumerate(class_names):
        precision = true_pos[i] / predicted[i] if predicted[i] else 0.0
        recall = true_pos[i] / actual[i] if actual[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[name] = {
            "precision": float(precision),
            "recall": float(recall),
            "f1": float(f1),
            "support": int(actual[i]),
        }
    return out


# ------------------------------------------------------------------------- inference


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def predict_logits(
    model: nn.Module,
    images: np.ndarray | torch.Tensor,
    mean: list[float],
    std: list[float],
    *,
    batch_size: int = 512,
    device: torch.device | str | None = None,
    tta: bool = SERVED_TTA,
) -> torch.Tensor:
    """Float32 logits ``[N, C]`` (on CPU) of ``inference.predict`` for uint8 images ``[N, 3, H, W]``.

    The images go to ``device`` once as uint8 and are normalised there batch by batch.
    """
    return predict_logits_with_single_view(
        model, images, mean, std, batch_size=batch_size, device=device, tta=tta
    )[0]


@torch.no_grad()
def predict_logits_with_single_view(
    model: nn.Module,
    images: np.ndarray | torch.Tensor,
    mean: list[float],
    std: list[float],
    *,
    batch_size: int = 512,
    device: torch.device | str | None = None,
    tta: bool = SERVED_TTA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``predict_logits`` and the logits of the unflipped images, from the same forward passes."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device) if device is not None else default_device()
    images = torch.as_tensor(images)
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be uint8 [N, 3, H, W], got {images.dtype} {tuple(images.shape)}")
    model = model.to(device).eval()
    on_device = images.to(device, non_blocking=True)  # uint8: 4x less transfer than float
    normalize = Normalize(mean, std, device)
    served, single = [], []
    for start in range(0, len(on_device), batch_size):
        logits, view = predict_with_single_view(
            model, normalize(on_device[start : start + batch_size]), tta=tta
        )
        served.append(logits.cpu())
        single.append(view.cpu())
    if not served:
        return torch.empty(0, 0), torch.empty(0, 0)
    return torch.cat(served), torch.cat(single)


def evaluate_loaded(
    model: nn.Module,
    info: ModelInfo,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: list[str],
    *,
    tta: bool = SERVED_TTA,
    batch_size: int = 512,
    device: torch.device | str | None = None,
    max_misclassified: int = MAX_MISCLASSIFIED,
    attribution_per_class: int = ATTRIBUTION_PER_CLASS,
) -> EvalResult:
    """Evaluate an in-memory model (``info`` is its ``ModelInfo``) on uint8 images and labels.

    ``tta`` (default: as a published model serves) makes ``accuracy``, the loss, the confusion
    matrix and the misclassified images those of the flip-TTA predictions.
    ``attribution_per_class`` correct and as many misclassified images per class get attribution
    maps for the report (0: none).
    """
    check_compatible(info, class_names, int(images.shape[-1]))
    if len(labels) == 0:
        raise ValueError("the test split is empty: nothing to evaluate")
    labels_t = torch.as_tensor(labels, dtype=torch.int64)
    logits, plain = predict_logits_with_single_view(
        model, images, info.mean, info.std, batch_size=batch_size, device=device, tta=tta
    )
    probs = logits.softmax(dim=1)
    predictions = probs.argmax(dim=1)
    loss = float(nn.functional.cross_entropy(logits, labels_t))

    num_classes = len(class_names)
    matrix = confusion_matrix(labels_t.numpy(), predictions.numpy(), num_classes)
    per_class = per_class_metrics(matrix, class_names)
    wrong = spread_over_classes(
        (predictions != labels_t).nonzero().flatten().numpy(), labels, max_misclassified
    )
    misclassified = [
        {
            "index": int(i),
            "true": class_names[int(labels_t[i])],
            "predicted": class_names[int(predictions[i])],
            "confidence": float(probs[i, predictions[i]]),
        }
        for i in wrong
    ]
    grid, note = _attribution(model, info, images, labels, predictions, class_names, attribution_per_class,
                              device=device, tta=tta)  # fmt: skip
    return EvalResult(
        accuracy=float((predictions == labels_t).float().mean()),
        accuracy_plain=float((plain.argmax(dim=1) == labels_t).float().mean()),
        tta=tta,
        loss=loss,
        macro_f1=float(np.mean([m["f1"] for m in per_class.values()])),
        num_examples=len(labels_t),
        class_names=list(class_names),
        per_class=per_class,
        confusion_matrix=matrix.tolist(),
        misclassified=misclassified,
        misclassified_images=np.asarray(images[wrong]) if len(wrong) else None,
        attribution=grid,
        attribution_note=note,
    )


def _attribution(model, info, images, labels, predictions, class_names, per_class, *, device, tta):
    """``(AttributionGrid or None, why not)``: a model Captum cannot differentiate gets a note, not an error."""
    if per_class <= 0:
        return None, "attribution maps were not requested"
    try:
        grid = attribution_grid(model, info, images, labels, predictions.numpy(), class_names, per_class=per_class,
                                device=device or default_device(), tta=tta)  # fmt: skip
    except RuntimeError as exc:  # e.g. a model whose output does not depend differentiably on its input
        log.warning("no attribution maps: %s", exc)
        return None, f"attribution maps could not be computed: {exc}"
    return grid, "" if grid is not None else "no test images to explain"


def spread_over_classes(indices: np.ndarray, labels: np.ndarray, limit: int) -> np.ndarray:
    """Up to ``limit`` of ``indices``, taken round-robin over their true classes, in index order.

    Test sets are often sorted by class; the first N errors would all share one class.
    """
    labels = np.asarray(labels)
    per_class = (
        [list(indices[labels[indices] == c]) for c in np.unique(labels[indices])] if len(indices) else []
    )
    chosen: list[int] = []
    depth = 0
    while len(chosen) < limit and any(depth < len(group) for group in per_class):
        chosen += [group[depth] for group in per_class if depth < len(group)][: limit - len(chosen)]
        depth += 1
    return np.array(sorted(chosen), dtype=np.int64)


def check_compatible(info, class_names: list[str], image_size: int) -> None:
    """Raise ValueError unless the model was built for these classes and this image size."""
    if list(info.class_names) != list(class_names):
        raise ValueError(
            f"model classes {list(info.class_names)} do not match the dataset classes {list(class_names)}"
        )
    if int(info.image_size) != int(image_size):
        raise ValueError(f"model expects {info.image_size}px images, the dataset has {image_size}px images")


def evaluate_model(
    model_dir_or_uri: str | os.PathLike,
    data_path_or_uri: str | os.PathLike,
    *,
    tta: bool = SERVED_TTA,
    batch_size: int = 512,
    history_path: str | os.PathLike | None = None,
    params: dict | None = None,
    device: torch.device | str | None = None,
    attribution_per_class: int = ATTRIBUTION_PER_CLASS,
) -> EvalResult:
    """Load a model directory and a prepared dataset, and evaluate on its test split.

    ``history_path`` (a ``history.json``) defaults to one in the model directory or next to it
    (the training output layout ``<dir>/model/`` + ``<dir>/history.json``), if any.
    ``params`` are shown in the report; the model's training config (``ModelInfo.extra``) is added.
    """
    from cifar10_kfp.data.shards import load_dataset
    from cifar10_kfp.storage import is_remote
    from cifar10_kfp.train.models import INFO_FILE, load_model

    if not is_remote(model_dir_or_uri) and not (Path(model_dir_or_uri) / INFO_FILE).is_file():
        raise FileNotFoundError(
            f"{model_dir_or_uri} is not a model directory: it has no {INFO_FILE} (expected model.safetensors + {INFO_FILE})"
        )
    device = torch.device(device) if device is not None else default_device()
    model, info = load_model(model_dir_or_uri, device=device)
    dataset = load_dataset(data_path_or_uri)
    images, labels = dataset.split("test")
    result = evaluate_loaded(
        model,
        info,
        images,
        labels,
        dataset.class_names,
        tta=tta,
        batch_size=batch_size,
        device=device,
        attribution_per_class=attribution_per_class,
    )
    if history_path is None and not is_remote(model_dir_or_uri):
        # the model dir itself, or the training output dir that holds model/ and history.json
        candidates = [Path(model_dir_or_uri) / "history.json", Path(model_dir_or_uri).parent / "history.json"]
        history_path = next((c for c in candidates if c.is_file()), None)
    result.history = load_history(history_path) if history_path else []
    result.params = {**(info.extra or {}), **(params or {})}
    result.model_summary = {
        "architecture": info.architecture,
        "model_config": info.model_config,
        "num_classes": info.num_classes,
        "image_size": info.image_size,
        "mean": info.mean,
        "std": info.std,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device),
    }
    meta = dataset.metadata()
    result.dataset_summary = {
        "source_digest": dataset.source_digest,
        "image_size": dataset.image_size,
        "sizes": meta["sizes"],
        "test_counts": meta["counts"]["test"],
        "mean": meta["mean"],
        "std": meta["std"],
        **{k: v for k, v in dataset.extra.items() if isinstance(v, (str, int, float, bool))},
    }
    log.info(
        "test accuracy %.4f%s (single view %.4f), loss %.4f on %d images",
        result.accuracy,
        " with flip TTA, as served" if result.tta else "",
        result.accuracy_plain,
        result.loss,
        result.num_examples,
    )
    track_final_metrics(result)
    return result


def track_final_metrics(result: EvalResult) -> None:
    """The scalar metrics to the step's MLflow run, when the environment names one (``cifar10_kfp.tracking``).

    Metrics only: KFP's launcher logs the step's inputs as the run's params, and MLflow refuses a
    param logged twice with another spelling of its value.
    """
    from cifar10_kfp.tracking import open_tracker

    tracker = open_tracker("evaluate")
    if tracker.enabled:
        tracker.final(result.scalars())
        tracker.close()


def load_history(path: str | os.PathLike) -> list[dict]:
    """Read ``history.json`` (a list of per-epoch dicts); a missing or empty file gives ``[]``."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return []
    raw = json.loads(path.read_text())
    if isinstance(raw, dict) and "history" in raw:  # tolerate {"history": [...]}
        raw = raw["history"]
    if not isinstance(raw, list) or not all(isinstance(row, dict) for row in raw):
        raise ValueError(f"{path}: expected a JSON list of per-epoch objects, got {type(raw).__name__}")
    return raw
