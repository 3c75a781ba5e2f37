"""Datasets: download (verified, content-addressed), safe archive handling, preprocessing.

Modules: ``http_fetch`` and ``download`` (a source fetched once, checked, kept in the store by its
digest), ``archives`` and ``layout`` (safe archive reading, the source's layout), ``images`` and
``official`` (decoding), ``splits`` (the validation split), ``preprocess`` (a source to the
prepared dataset), ``format`` (the prepared-dataset file that every later step reads).

The API below loads on first use: importing this package (for ``CIFAR10_URL``) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.data.download import ChecksumError, DownloadResult, fetch_dataset
    from cifar10_kfp.data.format import PreparedDataset, load_prepared, read_metadata, save_prepared
    from cifar10_kfp.data.layout import CIFAR10_CHECKSUM, CIFAR10_URL, MAX_VAL_FRACTION
    from cifar10_kfp.data.preprocess import (
        PrepareParams,
        prepare_dataset,
        prepare_from_source,
        prepare_to_file,
    )

__all__ = [
    "CIFAR10_CHECKSUM", "CIFAR10_URL", "ChecksumError", "DownloadResult", "PrepareParams", "PreparedDataset",
    "MAX_VAL_FRACTION", "fetch_dataset", "load_prepared", "prepare_dataset", "prepare_from_source", "prepare_to_file",
    "read_metadata", "save_prepared",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
