"""Kubeflow Model Registry: register a published version, and resolve ``model-registry://`` URIs.

A published version lives in the object store (``cifar10_kfp.publish``); registering it makes it
visible to the rest of Kubeflow (the Model Registry UI, KServe's ``model-registry://`` storage
URIs). The registered model is the ``model_name``, the model version is our version id, and its
model artifact is the version's Triton model repository (``<version>/triton``, the TorchScript
program KServe's Triton runtime serves), written as the client's ``s3_uri_from`` writes S3 URIs
(``s3://bucket/key?endpoint=...&defaultRegion=...``). KServe's model-registry storage initializer
hands that folder to the runtime, so ``model-registry://<name>/<version>`` deploys what the
version's ``s3://`` storage URI deploys.

Registering is idempotent: a version already registered with the same artifact is left as it
is; one registered without its artifact (an interrupted registration) gets it; one registered
with a different artifact is refused, never overwritten.

The client is ``model-registry`` pinned to the server release we test against (pyproject.toml).
Auth: a bearer token from ``MODEL_REGISTRY_TOKEN``, else the file named by
``KF_PIPELINES_SA_TOKEN_PATH``, else the pod's service-account token; it is handed to the client
only, never logged, and no error message here contains it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

SCHEME = "model-registry://"
URL_ENV = "MODEL_REGISTRY_URL"
TOKEN_ENV = "MODEL_REGISTRY_TOKEN"
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"  # the client's own convention: a path to a token file
SA_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# What KServe's kserve-tritonserver runtime lists for TorchScript (supportedModelTypes: pytorch "1").
MODEL_FORMAT_NAME = "pytorch"
MODEL_FORMAT_VERSION = "1"
AUTHOR = "cifar10-kfp"
SERVED_FOLDER = "triton"  # the folder of a version that the artifact names (cifar10_kfp.publish.bundle)
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelRegistryError(RuntimeError):
    """The model registry was unreachable, refused a call, or holds something that contradicts us."""


@dataclass
class Registration:
    """Where a version is registered, and whether this call registered it or found it registered."""

    url: str
    model_name: str
    version: str
    artifact_uri: str
    registered_model_id: str
    model_version_id: str
    artifact_id: str
    already_registered: bool

    @property
    def registry_uri(self) -> str:
        return f"{SCHEME}{self.model_name}/{self.version}"

    def to_dict(self) -> dict:
        return {**asdict(self), "registry_uri": self.registry_uri}


def is_registry_uri(value) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def parse_registry_uri(uri: str) -> tuple[str, str | None]:
    """``model-registry://<name>[/<version>]`` -> ``(name, version or None)``; ValueError naming the URI."""
    if not is_registry_uri(uri):
        raise ValueError(f"{uri!r} is not a model registry URI ({SCHEME}<name>[/<version>])")
    parts = uri[len(SCHEME) :].rstrip("/").split("/")
    if not 1 <= len(parts) <= 2 or not all(_SEGMENT.match(p) for p in parts):
        raise ValueError(
            f"invalid model registry URI {uri!r}: use {SCHEME}<name> or {SCHEME}<name>/<version>"
        )
    return parts[0], parts[1] if len(parts) == 2 else None


def registry_url(url: str | None = None) -> str:
    """``url``, else ``MODEL_REGISTRY_URL``; ValueError when neither is set or the URL is not http(s)://host[:port]."""
    url = (url or os.environ.get(URL_ENV, "")).strip()
    if not url:
        raise ValueError(
            f"no model registry URL: pass one or set {URL_ENV} (e.g. http://model-registry:8080)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise ValueError(f"invalid model registry URL {url!r}: use http(s)://host[:port], no path")
    if parts.username or parts.password:
        raise ValueError(
            "the model registry URL must not carry credentials: set MODEL_REGISTRY_TOKEN instead"
        )
    return url.rstrip("/")


def resolve_token(env: Mapping[str, str] | None = None, sa_token_file: str = SA_TOKEN_FILE) -> str | None:
    """The bearer token: ``MODEL_REGISTRY_TOKEN``, the file at ``KF_PIPELINES_SA_TOKEN_PATH``, or the pod's SA token."""
    env = os.environ if env is None else env
    if token := env.get(TOKEN_ENV, "").strip():
        return token
    for path in (env.get(TOKEN_PATH_ENV, ""), sa_token_file):
        if path and Path(path).is_file():
            return Path(path).read_text().strip() or None
    return None


def artifact_uri(version_uri: str, *, endpoint: str, secure: bool, region: str) -> str:
    """The artifact URI of a version: its Triton repository, as ``model_registry.utils.s3_uri_from`` writes it."""
    from cifar10_kfp.storage import join_uri, parse_uri

    s3_uri_from = _client_module("model_registry.utils").s3_uri_from

    location = parse_uri(join_uri(version_uri, SERVED_FOLDER))
    scheme = "https" if secure else "http"
    return s3_uri_from(location.key, location.bucket, endpoint=f"{scheme}://{endpoint}", region=region)


def version_uri_of_artifact(uri: str) -> str:
    """The store URI of the version behind an artifact URI: no query, and the version folder, not ``triton/``."""
    base = uri.split("?", 1)[0].rstrip("/")
    if base.rsplit("/", 1)[-1] == SERVED_FOLDER:
        base = base.rsplit("/", 1)[0]
    return base


@contextlib.contextmanager
def connect(url: str | None = None, *, token: str | None = None) -> Iterator:
    """A ``model_registry.ModelRegistry`` client for ``url``; ``ModelRegistryError`` if the server cannot be reached."""
    url = registry_url(url)
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    token = token if token is not None else resolve_token()
    # One private event loop for this client: the client would otherwise patch asyncio process-wide
    # (nest_asyncio), which a KFP component or a notebook does not expect.
    loop = asyncio.new_event_loop()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", UserWarning
            )  # the client's import warns about a pydantic field name
            from model_registry import ModelRegistry

        try:
            client = ModelRegistry(
                f"{parts.scheme}://{parts.hostname}", parts.port or (443 if secure else 80), author=AUTHOR,
                is_secure=secure, user_token=token, user_token_envvar="", async_runner=loop.run_until_complete,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the client raises aiohttp, store and API errors alike
            raise ModelRegistryError(
                f"the model registry at {url} is unreachable or refused: {_describe(exc)}"
            ) from exc
        yield client
    finally:
        loop.close()


def _client_module(name: str):
    """Import a module of the ``model-registry`` client, whose import warns about a pydantic field name."""
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return importlib.import_module(name)


def _describe(exc: BaseException) -> str:
    """The error's type and first line: the client's API errors carry the whole response below it."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def register_version(
    url: str | None,
    *,
    model_name: str,
    version: str,
    artifact: str,
    properties: Mapping[str, str | int | float | bool],
    description: str = "",
    token: str | None = None,
) -> Registration:
    """Register ``model_name``/``version`` with its ``artifact`` URI and custom ``properties``, idempotently.

    ``ModelRegistryError`` when the server is unreachable or refuses, or when the version is
    already registered with another artifact (a registered version is never changed).
    """
    url = registry_url(url)
    with connect(url, token=token) as client:
        try:
            existing = (
                client.get_model_version(model_name, version)
                if client.get_registered_model(model_name)
                else None
            )
            if existing is None:
                client.register_model(
                    model_name, artifact, version=version, model_format_name=MODEL_FORMAT_NAME,
                    model_format_version=MODEL_FORMAT_VERSION, description=description or None,
                    metadata=dict(properties), author=AUTHOR, owner=AUTHOR,
                )  # fmt: skip
            else:
                _check_or_complete(client, existing, model_name, version, artifact)
            model = client.get_registered_model(model_name)
            mv = client.get_model_version(model_name, version)
            art = client.get_model_artifact(model_name, version)
        except ModelRegistryError:
            raise
        except Exception as exc:  # noqa: BLE001 - connection, store and API errors of the client alike
            raise ModelRegistryError(
                f"registering {model_name} {version} in the model registry at {url} failed: {_describe(exc)}"
            ) from exc
    if art is None or art.uri != artifact:
        raise ModelRegistryError(
            f"{model_name} {version} is registered but its artifact did not read back as {artifact}"
        )
    log.info("model registry %s: %s %s %s (version id %s)", url, model_name, version,
             "was already registered" if existing is not None else "registered", mv.id)  # fmt: skip
    return Registration(
        url=url, model_name=model_name, version=version, artifact_uri=artifact, registered_model_id=str(model.id),
        model_version_id=str(mv.id), artifact_id=str(art.id), already_registered=existing is not None,
    )  # fmt: skip


def _check_or_complete(client, existing, model_name: str, version: str, artifact: str) -> None:
    """A re-registration: the same artifact is a no-op, a missing one is added, another one is refused."""
    current = client.get_model_artifact(model_name, version)
    if current is None:
        # An earlier registration stopped between the version and its artifact: finish it. The
        # client (pinned) has no public call for this step of its own register_model.
        client.async_runner(
            client._register_model_artifact(
                existing, model_name, artifact, model_format_name=MODEL_FORMAT_NAME,
                model_format_version=MODEL_FORMAT_VERSION,
            )
        )  # fmt: skip
        log.warning("model registry: %s %s had no artifact; added %s", model_name, version, artifact)
    elif current.uri != artifact:
        raise ModelRegistryError(
            f"{model_name} {version} is already registered with artifact {current.uri}, not {artifact}; "
            "a registered version is never changed"
        )


def resolve_registry_uri(uri: str, *, url: str | None = None, token: str | None = None) -> str:
    """The store URI of the version a ``model-registry://<name>[/<version>]`` URI names.

    Without a version: the newest version of the model, as KServe's model-registry storage
    initializer picks it. ``FileNotFoundError`` when the model, version or artifact is missing.
    """
    name, version = parse_registry_uri(uri)
    url = registry_url(url)
    with connect(url, token=token) as client:
        try:
            if client.get_registered_model(name) is None:
                raise FileNotFoundError(f"no model named {name!r} in the model registry at {url}")
            if version is None:
                newest = next(
                    iter(client.get_model_versions(name).order_by_creation_time().descending()), None
                )
                if newest is None:
                    raise FileNotFoundError(f"model {name!r} has no versions in the model registry at {url}")
                version = newest.name
            if client.get_model_version(name, version) is None:
                raise FileNotFoundError(
                    f"model {name!r} has no version {version!r} in the model registry at {url}"
                )
            art = client.get_model_artifact(name, version)
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - connection, store and API errors of the client alike
            raise ModelRegistryError(
                f"resolving {uri} in the model registry at {url} failed: {_describe(exc)}"
            ) from exc
    if art is None or not art.uri:
        raise FileNotFoundError(f"{name} {version} in the model registry at {url} has no model artifact")
    return version_uri_of_artifact(art.uri)
