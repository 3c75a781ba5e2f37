"""Numeric settings read from environment variables, each refused by name when it is not a number in range."""

from __future__ import annotations

import os
from collections.abc import Mapping


def env_number(name: str, default, *, kind: type = float, allow_zero: bool = False,
               env: Mapping[str, str] | None = None):  # fmt: skip
    """``name``'s value as ``kind`` (``int`` or ``float``), ``default`` when unset or empty.

    Raises ``ValueError`` naming the variable and its value when it is not a ``kind`` or is
    negative (or zero, unless ``allow_zero``).
    """
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name}={raw!r} is not {what}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}={raw!r} must be {'0 or more' if allow_zero else 'positive'}")
    return value
