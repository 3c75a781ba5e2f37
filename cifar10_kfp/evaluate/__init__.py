"""Evaluation: a model directory on the test split of a prepared dataset, and its report.

Modules: ``evaluation`` (accuracy, loss, per-class metrics and the confusion matrix, with the
same prediction rule as training and serving), ``attribution`` (integrated-gradients maps of where
the model looked), ``report`` (one self-contained HTML page and a short Markdown summary).

The API below loads on first use: importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.evaluate.evaluation import EvalResult, evaluate_loaded, evaluate_model
    from cifar10_kfp.evaluate.report import render_html, render_markdown, write_outputs

__all__ = [
    "EvalResult",
    "evaluate_loaded",
    "evaluate_model",
    "render_html",
    "render_markdown",
    "write_outputs",
]
__getattr__, __dir__ = lazy_exports(__name__, __file__)
