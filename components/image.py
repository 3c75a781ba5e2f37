"""The one place that names the container image every component runs in.

The default is the image built from ``images/train``, tagged with the package version. Override
it at compile time with ``cifar10-kfp compile --image`` or the ``CIFAR10_KFP_IMAGE`` variable.
"""

from __future__ import annotations

import os

REGISTRY_DEFAULT = "ghcr.io/cifar10-kfp/cifar10-kfp"
VERSION = "0.1.0"  # kept equal to pyproject's version by tests/images/test_train_image.py


def image() -> str:
    """The image reference components are compiled with."""
    return os.environ.get("CIFAR10_KFP_IMAGE") or f"{REGISTRY_DEFAULT}:{VERSION}"


IMAGE = image()
