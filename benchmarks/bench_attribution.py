"""Attribution maps: the cost of the report's Integrated Gradients grid, against the evaluation itself.

The report's default grid is 2 correctly and 2 wrongly classified test images per class, 40 for
CIFAR-10, each explained with ``N_STEPS`` Integrated Gradients steps of the served (flip-TTA)
prediction: about ``40 * N_STEPS * 2`` forward and backward passes. It is timed for the ``cpu``
preset's model (its weights do not change the cost, so it is not trained here) on the real test
images, against ``evaluate_loaded`` without maps on the same test split in the same run.

    .venv/bin/python -m benchmarks.run --only attribution [--quick]
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import BenchContext, best_seconds, row, section

TARGET_S = 5.0  # "a few seconds on a CPU" for the default grid


def run(ctx: BenchContext) -> dict:
    from cifar10_kfp.evaluate.attribution import N_STEPS, PER_CLASS, integrated_gradients
    from cifar10_kfp.evaluate.evaluation import evaluate_loaded
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.train.models import ModelInfo, build_model

    dataset = ctx.dataset(
        max_train=ctx.pick(smoke=0, quick=100, full=100), max_test=ctx.pick(smoke=0, quick=1_000, full=0)
    )
    images, labels = dataset.split("test")
    config = make_config("cpu", {})
    torch.manual_seed(0)
    model = build_model(
        config.architecture, dataset.num_classes, dataset.image_size, **config.model_config()
    ).eval()
    info = ModelInfo(config.architecture, dataset.num_classes, dataset.image_size, dataset.class_names,
                     dataset.mean, dataset.std)  # fmt: skip
    # the default grid's size: 2 * PER_CLASS images of every class, explained for some class
    per_class = [np.flatnonzero(labels == c)[: 2 * PER_CLASS] for c in range(dataset.num_classes)]
    grid = np.concatenate(per_class)
    targets = np.random.default_rng(0).integers(0, dataset.num_classes, len(grid))
    repeats = ctx.pick(smoke=1, quick=2, full=3)
    maps = best_seconds(
        lambda: integrated_gradients(model, info, images[grid], targets, device="cpu"), repeats=repeats
    )
    evaluation = best_seconds(
        lambda: evaluate_loaded(model, info, images, labels, dataset.class_names, device="cpu",
                                attribution_per_class=0),
        repeats=repeats,
    )  # fmt: skip
    rows = [
        row(
            f"attribution grid: {len(grid)} images x {N_STEPS} IG steps, flip TTA (s) vs evaluating "
            f"{len(labels):,} test images",
            maps["best_s"],
            evaluation["best_s"],
            unit="s",
            target=f"<= {TARGET_S:g} s",
            met=maps["best_s"] <= TARGET_S,
        )
    ]
    notes = [
        f"Model: the `cpu` preset's {config.architecture} (untrained: the cost does not depend on the weights); "
        f"CPU, {torch.get_num_threads()} threads; best of {repeats} after a warm-up (benchmarks/bench_attribution.py).",
        "The baseline is `evaluate_loaded` without maps (flip TTA and the single view over the whole test split), "
        "so the ratio is what the maps add to the evaluate step.",
    ]
    details = {"maps": maps, "evaluation": evaluation, "grid_images": int(len(grid)), "n_steps": N_STEPS,
               "test_images": int(len(labels))}  # fmt: skip
    return section("Attribution maps", rows, details=details, notes=notes)
