"""The official CIFAR-10 python batches, parsed with a restricted unpickler.

The batches are Python 2 pickles of dicts: ``data`` (a uint8 numpy array, one 3072-byte row
per image holding the R, G and B planes of 32x32 pixels), ``labels`` (a list of ints),
``batch_label`` and ``filenames``; ``batches.meta`` holds ``label_names``. They are parsed only
after the archive's checksum matched, and even then with an unpickler that can build nothing
but dicts, lists, strings, ints and numpy arrays: any other global is refused.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

IMAGE_SHAPE = (3, 32, 32)
ROW_BYTES = 3 * 32 * 32


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]  # the same function, numpy 1.x
    return _reconstruct


class RestrictedUnpickler(pickle.Unpickler):
    """Refuses every global except the few a pickled numpy array needs."""

    def find_class(self, module: str, name: str):
        allowed = {
            ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
            ("numpy", "ndarray"): lambda: np.ndarray,
            ("numpy", "dtype"): lambda: np.dtype,
            # Python 3 pickles of bytes at protocol 2 go through codecs.encode(str, "latin1").
            ("_codecs", "encode"): lambda: __import__("codecs").encode,
        }
        factory = allowed.get((module, name))
        if factory is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")
        return factory()


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def load_batch(name: str, data: bytes) -> dict:
    """Unpickle one batch file safely; keys become str whether stored as bytes (Python 2) or str."""
    try:
        obj = RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as exc:  # noqa: BLE001 - any failure here means a malformed batch
        raise ValueError(f"{name}: not a valid CIFAR-10 python batch: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{name}: expected a dict, got {type(obj).__name__}")
    return {_text(k): v for k, v in obj.items()}


def batch_arrays(name: str, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 3, 32, 32], labels int64 [N])`` from a parsed batch; checks shapes and types."""
    data, labels = batch.get("data"), batch.get("labels")
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != ROW_BYTES
    ):
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{name}: 'data' must be a uint8 array of N x {ROW_BYTES}, got {got}")
    if not isinstance(labels, list) or not all(isinstance(x, int) for x in labels):
        raise ValueError(f"{name}: 'labels' must be a list of ints")
    if len(labels) != data.shape[0]:
        raise ValueError(f"{name}: {data.shape[0]} images but {len(labels)} labels")
    # Row layout is R plane, G plane, B plane, each row-major 32x32: exactly C x H x W.
    return data.reshape(-1, *IMAGE_SHAPE), np.asarray(labels, dtype=np.int64)


def label_names(name: str, meta: dict) -> list[str]:
    names = meta.get("label_names")
    if not isinstance(names, list) or not names:
        raise ValueError(f"{name}: 'label_names' must be a non-empty list")
    return [_text(n) for n in names]
