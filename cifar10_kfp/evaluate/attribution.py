"""Attribution maps for the report: where in the image the evaluated model looked.

Integrated Gradients (Captum) of the served prediction (``inference.predict``, flip TTA
included) with respect to the input pixels, for the predicted class, from a baseline of the
model's mean colour (an all-zero normalised input). For each class the grid holds a few correctly
and a few wrongly classified test images, in test order, so every class shows both what the
model gets right and where it goes wrong. The attributions' absolute values, summed over the
colour channels and scaled per image, are drawn over the image.

The cost is bounded by the grid: ``2 * per_class * num_classes`` images times ``n_steps``
forward and backward passes (a few seconds on a CPU for CIFAR-10's default grid;
``benchmarks/bench_attribution.py`` measures it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cifar10_kfp.train.inference import SERVED_TTA, Normalize, predict

log = logging.getLogger(__name__)

PER_CLASS = 2  # correct and misclassified images per class in the default grid
N_STEPS = 16  # Integrated Gradients steps: enough for stable maps on 32x32 images, cheap on a CPU
METHOD = "Integrated Gradients (Captum), predicted class, baseline = mean colour"


@dataclass
class AttributionGrid:
    """Test images with their attribution maps, grouped by true class."""

    indices: list[int]  # positions in the test split
    images: np.ndarray  # uint8 [K, 3, H, W]
    maps: np.ndarray  # float32 [K, H, W] in [0, 1]: |attribution| summed over channels, per-image scaled
    true: list[str]
    predicted: list[str]
    method: str
    seconds: float  # time to compute the maps
    per_class: int = PER_CLASS  # columns per kind (correct, misclassified) in the plotted grid

    @property
    def correct(self) -> list[bool]:
        return [t == p for t, p in zip(self.true, self.predicted)]


def pick_examples(labels: np.ndarray, predictions: np.ndarray, per_class: int = PER_CLASS) -> np.ndarray:
    """Per class (in class order): the first ``per_class`` correct, then the first ``per_class`` wrong indices."""
    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    chosen: list[int] = []
    for cls in np.unique(labels):
        of_class = labels == cls
        chosen += list(np.flatnonzero(of_class & (predictions == labels))[:per_class])
        chosen += list(np.flatnonzero(of_class & (predictions != labels))[:per_class])
    return np.array(chosen, dtype=np.int64)


def integrated_gradients(
    model: nn.Module,
    info,
    images: np.ndarray | torch.Tensor,
    targets: np.ndarray | torch.Tensor,
    *,
    n_steps: int = N_STEPS,
    device: torch.device | str = "cpu",
    tta: bool = SERVED_TTA,
) -> np.ndarray:
    """Per-image attribution maps ``[K, H, W]`` in [0, 1] for uint8 ``images`` and target classes."""
    from captum.attr import IntegratedGradients

    device = torch.device(device)
    model = model.to(device).eval()
    normalize = Normalize(info.mean, info.std, device)

    def served_logits(pixels: torch.Tensor) -> torch.Tensor:  # float pixels 0..255, differentiable
        return predict(model, pixels * normalize.scale + normalize.shift, tta=tta)

    pixels = torch.as_tensor(images).to(device).float()
    baseline = (torch.tensor(info.mean, dtype=torch.float32, device=device) * 255).view(1, 3, 1, 1)
    with torch.enable_grad():
        attributions = IntegratedGradients(served_logits).attribute(
            pixels,
            baselines=baseline.expand_as(pixels).contiguous(),
            target=torch.as_tensor(targets, dtype=torch.int64, device=device),
            n_steps=n_steps,
            internal_batch_size=max(1, 512 // (2 if tta else 1)),
        )
    maps = attributions.detach().abs().sum(dim=1).float().cpu().numpy()
    scale = np.percentile(maps.reshape(len(maps), -1), 99, axis=1).reshape(-1, 1, 1)
    return np.clip(maps / np.maximum(scale, 1e-12), 0.0, 1.0).astype(np.float32)


def attribution_grid(
    model: nn.Module,
    info,
    images: np.ndarray,
    labels: np.ndarray,
    predictions: np.ndarray,
    class_names: list[str],
    *,
    per_class: int = PER_CLASS,
    n_steps: int = N_STEPS,
    device: torch.device | str = "cpu",
    tta: bool = SERVED_TTA,
) -> AttributionGrid | None:
    """The report's grid for an evaluated model; None when ``per_class`` is 0 or the split is empty."""
    chosen = pick_examples(labels, predictions, per_class) if per_class > 0 else np.array([], np.int64)
    if not len(chosen):
        return None
    start = time.perf_counter()
    picked = np.asarray(images[chosen])
    predicted = np.asarray(predictions)[chosen]
    maps = integrated_gradients(model, info, picked, predicted, n_steps=n_steps, device=device, tta=tta)
    seconds = time.perf_counter() - start
    log.info("attribution maps for %d test images in %.1f s", len(chosen), seconds)
    return AttributionGrid(
        indices=[int(i) for i in chosen],
        images=picked,
        maps=maps,
        true=[class_names[int(labels[i])] for i in chosen],
        predicted=[class_names[int(p)] for p in predicted],
        method=METHOD + (", flip TTA as served" if tta else ""),
        seconds=seconds,
        per_class=per_class,
    )


def grid_positions(grid: AttributionGrid) -> list[tuple[int, int]]:
    """(row, column) of each image: one row per true class, correct ones left, misclassified right."""
    rows: dict[str, int] = {}
    used: dict[tuple[int, bool], int] = {}
    positions = []
    for true, ok in zip(grid.true, grid.correct):
        row = rows.setdefault(true, len(rows))
        column = used.get((row, ok), 0)
        used[(row, ok)] = column + 1
        positions.append((row, column if ok else grid.per_class + column))
    return positions


def plot_attribution_grid(grid: AttributionGrid) -> bytes:
    """The grid as one PNG: each image with its map overlaid, titled with true and predicted labels."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    positions = grid_positions(grid)
    rows, columns = max(r for r, _ in positions) + 1, 2 * grid.per_class
    fig = Figure(figsize=(1.55 * columns, 1.75 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for (row, column), image, heat, true, predicted, ok in zip(
        positions, grid.images, grid.maps, grid.true, grid.predicted, grid.correct
    ):
        ax = axes[row, column]
        ax.imshow(np.transpose(image, (1, 2, 0)), interpolation="nearest")
        ax.imshow(heat, cmap="inferno", alpha=0.55, vmin=0.0, vmax=1.0, interpolation="bilinear")
        color = "#17692e" if ok else "#b3261e"
        ax.set_title(f"true: {_plain(true)}\npred: {_plain(predicted)}", fontsize=7, color=color)
    fig.subplots_adjust(wspace=0.08, hspace=0.45)
    FigureCanvasAgg(fig)  # Agg explicitly: no display, no global pyplot state
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _plain(label: str) -> str:
    """A class name as literal text in a matplotlib title (no mathtext), shortened to fit a cell."""
    text = str(label).replace("$", r"\$")
    return text if len(text) <= 18 else text[:17] + "…"
