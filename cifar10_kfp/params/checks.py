"""The value rules of the pipeline parameters, one small function each.

A rule takes a typed value and returns ``None`` when it is allowed, else the allowed-range
text (``"use 1..10000"``) that ``cifar10_kfp.params`` puts after the parameter's name, or, for a
value that is malformed rather than out of range, a text starting with ``NOT_VALID``. The
rules that depend on other modules (object names, model names, presets, architectures) ask
those modules, so each rule is written once in the project.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

Check = Callable[..., "str | None"]
# A rule's text that starts with this says what the value is not (malformed JSON, say), rather than
# the range it should be in: ``params`` then writes "name=value is not valid JSON (...)", not "is out of range: ...".
NOT_VALID = "is not "

DATASET_SCHEMES = ("http", "https", "s3", "minio", "file")
_SHA256 = re.compile(r"^(sha256:)?[0-9a-fA-F]{64}$")
_MD5 = re.compile(r"^md5:[0-9a-fA-F]{32}$")


def int_range(lo: int, hi: int) -> Check:
    def check(value: int) -> str | None:
        return None if lo <= value <= hi else f"use {lo}..{hi}"

    return check


def float_range(lo: float, hi: float, *, lo_open: bool = False) -> Check:
    def check(value: float) -> str | None:
        if (lo < value if lo_open else lo <= value) and value <= hi:
            return None
        return f"use a value in {'(' if lo_open else '['}{lo:g}, {hi:g}]"

    return check


def dataset_uri(value: str) -> str | None:
    if not value.strip():
        return "must not be empty: use an http(s)://, s3://, minio://, file:// URI or a local path"
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme and scheme not in DATASET_SCHEMES:
        return f"unsupported scheme {scheme!r}: use one of {', '.join(s + '://' for s in DATASET_SCHEMES)} or a local path"
    if any(ord(ch) < 32 for ch in value):
        return "must not contain control characters"
    return None


def checksum(value: str) -> str | None:
    if value == "" or _SHA256.match(value) or _MD5.match(value):
        return None
    return "use '' (no check), sha256:<64 hex digits> (the prefix is optional) or md5:<32 hex digits>"


def _storage_rule(validate_name: str, hint: str, value: str) -> str | None:
    """Apply one of ``cifar10_kfp.storage``'s name rules; ``''`` always passes (the default applies)."""
    if value == "":
        return None
    from cifar10_kfp import storage

    try:
        getattr(storage, validate_name)(value)
    except storage.InvalidNameError as exc:
        return f"use {hint}: {exc}"
    return None


def checkpoint_uri(value: str) -> str | None:
    return _storage_rule("parse_uri", "'' (derived from the run id) or an s3://bucket/key URI", value)


def bucket(value: str) -> str | None:
    return _storage_rule(
        "validate_bucket", "'' (CIFAR10_KFP_BUCKET, default mlpipeline) or a valid S3 bucket name", value
    )


def storage_prefix(value: str) -> str | None:
    # A bare "/" stands for the bucket's root, which the key rule alone would refuse as empty.
    return _storage_rule(
        "validate_key",
        "'' (CIFAR10_KFP_PREFIX, default cifar10-kfp/) or a valid object key prefix",
        value.strip("/") or ("x" if value else ""),
    )


def model_name(value: str) -> str | None:
    from cifar10_kfp.publish.registry import validate_model_name  # the registry owns its name rule

    try:
        validate_model_name(value)
    except ValueError as exc:
        return "use " + str(exc).split(": use ", 1)[-1]
    return None


def registry_url(value: str) -> str | None:
    """Empty (off) or an http(s)://host[:port] URL (``kubeflow_registry.registry_url``'s rule)."""
    if not value:
        return None
    from cifar10_kfp.publish.kubeflow_registry import registry_url as check

    try:
        check(value)
    except ValueError:
        return "empty, or http(s)://host[:port] with no path, query or credentials"
    return None


def available_presets() -> tuple[str, ...]:
    """The training presets (``cifar10_kfp.train.config.PRESETS``)."""
    from cifar10_kfp.train.config import PRESET_NAMES

    return PRESET_NAMES


def available_architectures() -> tuple[str, ...]:
    """The registered model architectures (``cifar10_kfp.train.models``)."""
    from cifar10_kfp.train import models

    return tuple(models.available_models())


def preset(value: str) -> str | None:
    presets = available_presets()
    return None if value in presets else f"use one of {', '.join(presets)}"


def architecture(value: str) -> str | None:
    names = available_architectures()
    return None if value in names else f"use one of {', '.join(names)}"


def extra_hparams(value: str) -> str | None:
    if value.strip() in ("", "{}"):
        return None
    example = "'{\"weight_decay\": 5e-4}'"
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return f"{NOT_VALID}valid JSON ({exc}): it must be a JSON object of training-config overrides, e.g. {example}"
    if not isinstance(parsed, dict):
        return f"{NOT_VALID}a JSON object: it must be one of training-config overrides, got a JSON {type(parsed).__name__}"
    return None


def json_list_of_objects(max_items: int, example: str) -> Check:
    """A JSON list of 1..``max_items`` objects (the deeper per-item checks are the caller's)."""

    def check(value: str) -> str | None:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            return f"{NOT_VALID}valid JSON ({exc}): it must be a JSON list of objects, e.g. '{example}'"
        if not isinstance(parsed, list) or not all(isinstance(item, dict) for item in parsed):
            return "must be a JSON list of objects, one per trial"
        if not 1 <= len(parsed) <= max_items:
            return f"must hold 1..{max_items} trials, got {len(parsed)}"
        return None

    return check


_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def kubernetes_name(value: str) -> str | None:
    """'' or a Kubernetes object name (a DNS-1123 subdomain: a service account, a secret)."""
    if value == "" or (len(value) <= 253 and _DNS1123_SUBDOMAIN.match(value)):
        return None
    return "use '' or a Kubernetes name: lower-case letters, digits, '-' and '.', at most 253 characters"


def kubernetes_names(value: str) -> str | None:
    """'' or comma-separated Kubernetes object names (image-pull secrets)."""
    bad = [name for name in (n.strip() for n in value.split(",")) if name and kubernetes_name(name)]
    if not bad:
        return None
    return f"use '' or comma-separated Kubernetes secret names; {bad[0]!r} is not one"


def coerce(name: str, kind: type, value):
    """Convert ``value`` to the parameter's type, accepting the string forms a command line gives."""
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name}={value!r} has the wrong type: expected a string")
        return value
    expected = "an integer" if kind is int else "a number"
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} has the wrong type: expected {expected}")
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            return int(value)
        raise ValueError(f"{name}={value!r} has the wrong type: expected {expected}")
    try:
        number = float(value) if isinstance(value, (int, float, str)) else None
    except ValueError:
        number = None
    if number is None:
        raise ValueError(f"{name}={value!r} has the wrong type: expected {expected}")
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return number


def one_of(*choices: str) -> Check:
    def check(value: str) -> str | None:
        return None if value in choices else f"use one of {', '.join(choices)}"

    return check
