"""Models for tests: a lookup model with hand-computable logits, and a tiny trained simple_cnn."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

# Six test images, three classes. Pixel (channel 0, row 0, column 0) holds an id that the
# lookup model below maps to fixed logits; column W-1 holds the id seen after a horizontal flip.
LABELS = [0, 0, 1, 1, 2, 2]
LOGITS = {
    0: [2.0, 0.0, 0.0],  # -> 0, right
    1: [0.0, 1.0, 0.0],  # -> 1, wrong (true 0)
    2: [0.0, 3.0, 0.0],  # -> 1, right
    3: [0.0, 1.0, 0.0],  # -> 1, right
    4: [1.0, 0.0, 0.0],  # -> 0, wrong (true 2)
    5: [0.0, 0.0, 2.0],  # -> 2, right
    6: [5.0, 0.0, 0.0],  # only seen flipped: rescues image 1 under TTA
}
FLIPPED_IDS = [0, 6, 2, 3, 4, 5]


class LookupModel(nn.Module):
    """Logits looked up from the id in pixel (0, 0, 0); needs mean 0 and std 1/255 to read raw values."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.tensor([LOGITS[i] for i in range(len(LOGITS))]))

    def forward(self, x):
        return self.table[x[:, 0, 0, 0].round().long()]


def lookup_case():
    images = np.zeros((6, 3, 4, 4), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(6)
    images[:, 0, 0, -1] = FLIPPED_IDS
    info = SimpleNamespace(class_names=["a", "b", "c"], image_size=4, mean=[0.0] * 3, std=[1 / 255] * 3)
    return LookupModel(), info, images, np.array(LABELS, dtype=np.int64)


def train_tiny_model(dataset, steps: int = 40):
    """A simple_cnn trained a few steps with a plain loop (not the training engine)."""
    from cifar10_kfp.train.models import ModelInfo, build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 40-step loop on tiny images: extra threads only contend on shared cores
    try:
        torch.manual_seed(0)
        model = build_model("simple_cnn", dataset.num_classes, dataset.image_size)
        fit(model, dataset, steps)
    finally:
        torch.set_num_threads(threads)
    info = ModelInfo(
        "simple_cnn", dataset.num_classes, dataset.image_size, dataset.class_names, dataset.mean, dataset.std
    )
    return model.eval(), info


def fit(model, dataset, steps):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    mean = torch.tensor(dataset.mean).view(1, 3, 1, 1)
    std = torch.tensor(dataset.std).view(1, 3, 1, 1)
    images = (torch.from_numpy(dataset.train_images).float() / 255 - mean) / std
    labels = torch.from_numpy(dataset.train_labels)
    for step in range(steps):
        idx = torch.arange(step * 64, step * 64 + 64) % len(labels)
        loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


def write_trained_model_dir(tiny_dataset_path, tmp_path: Path) -> Path:
    """Train ``train_tiny_model`` on a prepared file; write ``tmp_path/model`` and ``tmp_path/history.json``."""
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.train.models import save_model

    model, info = train_tiny_model(load_prepared(tiny_dataset_path))
    info.extra = {"epochs": 1, "learning_rate": 3e-3}
    save_model(model, info, tmp_path / "model")
    history = [
        {
            "epoch": e,
            "train_loss": 1.0 / e,
            "train_acc": 0.5 + 0.1 * e,
            "val_loss": 1.1 / e,
            "val_acc": 0.45 + 0.1 * e,
        }
        for e in (1, 2, 3)
    ]
    (tmp_path / "history.json").write_text(json.dumps(history))
    return tmp_path / "model"
