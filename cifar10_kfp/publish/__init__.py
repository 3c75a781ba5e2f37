"""Publishing: the champion/challenger gate, then a new, never-overwritten version in the registry.

Modules: ``release`` (the gate and ``publish_model``), ``registry`` (the registry's layout:
versions, the ``latest`` pointer, the name rules), ``bundle`` (TorchScript program, Triton
repository, KServe manifest), ``model_card`` (``model_card.json`` and ``.md``), ``serving`` (load a
published version with its preprocessing and predict image files), ``kubeflow_registry`` (Kubeflow
Model Registry: register a version, resolve ``model-registry://`` URIs) and ``registration`` (what
``publish_model`` registers, and resuming a publish whose registration failed).

The API below loads on first use: importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.publish.registry import (
        PublishError,
        latest_version,
        resolve_published,
        validate_model_name,
    )
    from cifar10_kfp.publish.release import (
        REGISTRY_MANIFEST_FILE,
        GateDecision,
        PublishResult,
        dataset_digests,
        publish_model,
        run_gate,
    )
    from cifar10_kfp.publish.serving import load_published, predict_files

__all__ = [
    "REGISTRY_MANIFEST_FILE", "GateDecision", "PublishError", "PublishResult", "dataset_digests", "latest_version", "load_published",
    "predict_files", "publish_model", "resolve_published", "run_gate", "validate_model_name",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
