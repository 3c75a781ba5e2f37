"""Talking to a Kubeflow Pipelines API server with ``kfp.Client``: shared by submit, schedule and runs.

Logging in (``Login``), in this order:

* ``--token`` or ``KF_PIPELINES_TOKEN``: a bearer token, passed as ``kfp.Client(existing_token=...)``.
  Multi-user Kubeflow's API server reviews it (``TokenReview``, audience ``pipelines.kubeflow.org``):
  e.g. ``kubectl create token default-editor -n <profile> --audience pipelines.kubeflow.org``.
* inside the cluster, the pod's projected KFP service-account token (``KF_PIPELINES_SA_TOKEN_PATH``, default
  ``/var/run/secrets/kubeflow/pipelines/token``, mounted by Kubeflow's ``access-ml-pipeline``
  PodDefault), through kfp's own ``ServiceAccountTokenVolumeCredentials``, which re-reads the file
  as the kubelet rotates it. ``kfp.Client`` does this by itself only when no host is given, and then
  it guesses the host from the *profile* namespace; here the host defaults to the KFP service in
  ``kubeflow``.
* ``--cookies`` or ``KF_PIPELINES_COOKIES``: the session cookie of a Dex / oauth2-proxy login through the
  Kubeflow gateway (``kfp.Client(cookies=...)``).

The token and cookies never appear in ``repr``, logs or error messages (``Login.redact``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_EXPERIMENT = "cifar10-kfp"
TOKEN_ENV = "KF_PIPELINES_TOKEN"
COOKIES_ENV = "KF_PIPELINES_COOKIES"
ENDPOINT_ENV = "KF_PIPELINES_ENDPOINT"  # kfp.Client's own variable for the host
SA_TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"  # = kfp.client.KF_PIPELINES_SA_TOKEN_ENV
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"  # = kfp.client.KF_PIPELINES_SA_TOKEN_PATH
IN_CLUSTER_HOST = (
    "http://ml-pipeline.kubeflow.svc.cluster.local:8888"  # the KFP API service of a Kubeflow install
)


@dataclass(frozen=True)
class Login:
    """Where the KFP API is and which credentials reach it. ``repr`` never shows a secret."""

    host: str
    token: str | None = field(default=None, repr=False)
    cookies: str | None = field(default=None, repr=False)
    token_path: str | None = None  # in-cluster service-account token file, re-read on every request
    method: str = (
        "none"  # how it logs in, for messages: "--token", "KF_PIPELINES_TOKEN", "service-account token", ...
    )

    @classmethod
    def resolve(
        cls,
        host: str | None = None,
        token: str | None = None,
        cookies: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Login:
        """Flags first, then environment variables, then the in-cluster service-account token."""
        env = os.environ if env is None else env
        in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
        method = "--token" if token else ""
        if not token and env.get(TOKEN_ENV):
            token, method = env[TOKEN_ENV], TOKEN_ENV
        token_path = None
        if not token:
            path = env.get(SA_TOKEN_PATH_ENV) or SA_TOKEN_PATH
            if os.path.isfile(path):
                token_path, method = path, f"service-account token {path}"
        cookies = cookies or env.get(COOKIES_ENV) or None
        if cookies and not method:
            method = "session cookies"
        host = host or env.get(ENDPOINT_ENV) or (IN_CLUSTER_HOST if in_cluster or token_path else None)
        if not host:
            raise ValueError(
                f"no KFP host: pass --host (e.g. http://localhost:8080 after `kubectl -n kubeflow port-forward "
                f"svc/ml-pipeline-ui 8080:80`) or set {ENDPOINT_ENV}"
            )
        return cls(host=host.rstrip("/"), token=token or None, cookies=cookies, token_path=token_path,
                   method=method or "none")  # fmt: skip

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``kfp.Client`` (they hold the secret: never log them)."""
        kwargs: dict[str, Any] = {"host": self.host}
        if self.token:
            kwargs["existing_token"] = self.token
        elif self.token_path:
            from kfp.client import ServiceAccountTokenVolumeCredentials

            kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(path=self.token_path)
        if self.cookies:
            kwargs["cookies"] = self.cookies
        return kwargs

    def redact(self, text: str) -> str:
        """``text`` with the token and every cookie value replaced by ``***``."""
        secrets = [self.token] if self.token else []
        for cookie in (self.cookies or "").split(";"):
            name, _, value = cookie.strip().partition("=")
            secrets.append(value or name)
        if self.token_path and os.path.isfile(self.token_path):
            with contextlib.suppress(OSError):
                secrets.append(Path(self.token_path).read_text().strip())
        for secret in sorted(filter(None, secrets), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def make_client(login: Login | str, namespace: str = "kubeflow"):
    """A ``kfp.Client`` for ``login`` (a bare host string logs in with nothing but the environment)."""
    import warnings

    import kfp

    if isinstance(login, str):
        login = Login.resolve(host=login)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # "This client only works with KFP v2.0.0-beta.2 and later"
        with explained_api_errors(login):
            return kfp.Client(namespace=namespace, **login.client_kwargs())


KFP_UNREACHABLE_CHECK = (
    "check that the port-forward is running (`kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80`) "
    f"and that --host / {ENDPOINT_ENV} names it, or that your kubeconfig's context is the cluster you mean "
    "(`kubectl config current-context`)"
)


@contextlib.contextmanager
def explained_api_errors(login: Login, what: str = "the KFP API", namespace: str | None = None):
    """Turn an HTTP error of the KFP API into a ``RuntimeError`` that says what to do, with secrets redacted;
    an API that cannot be reached at all (refused, timed out) into one line saying so. ``namespace`` is the
    profile the request was for, named when access to it is denied."""
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        with quiet_retries():
            yield
    except ApiException as exc:
        raise RuntimeError(login.redact(describe_api_error(exc, login, what, namespace))) from None
    except HTTPError as exc:  # urllib3 gave up: no HTTP answer at all
        message = f"{what} at {login.host} {unreachable_reason(exc)}; {KFP_UNREACHABLE_CHECK}"
        raise RuntimeError(login.redact(message)) from None


@contextlib.contextmanager
def quiet_retries():
    """Without -v, hide urllib3's warning per retry of a refused connection: three lines before the
    one that explains the failure. With -v (the root logger at DEBUG) they stay."""
    import logging

    pool_log = logging.getLogger("urllib3.connectionpool")
    saved = pool_log.level
    if logging.getLogger().level > logging.DEBUG:
        pool_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pool_log.setLevel(saved)


def unreachable_reason(exc: BaseException) -> str:
    """Why a urllib3 request got no answer, in words: refused, timed out, unknown host or dropped."""
    from urllib3.exceptions import (
        ConnectTimeoutError,
        MaxRetryError,
        NameResolutionError,
        NewConnectionError,
        ProtocolError,
        ReadTimeoutError,
    )

    reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason is not None else exc
    text = str(reason)
    if isinstance(reason, NameResolutionError):
        return "is unreachable: its host name does not resolve"
    if isinstance(reason, NewConnectionError) and "refused" in text.lower():
        return "refused the connection (nothing listens there)"
    if isinstance(reason, (ConnectTimeoutError, ReadTimeoutError)) and not isinstance(
        reason, NewConnectionError
    ):
        return "did not answer: the connection timed out"
    if isinstance(reason, ProtocolError):
        return f"dropped the connection ({str(reason.args[0]).rstrip('.') if reason.args else text})"
    detail = text.rpartition("]")[2].strip(" )\"'") or text
    return f"is unreachable ({detail})"


def describe_api_error(exc, login: Login, what: str = "the KFP API", namespace: str | None = None) -> str:
    """One message for an ``ApiException``: authentication failures say how to log in, denials which namespace."""
    detail = _api_error_message(exc.body)
    status = f"{exc.status} {exc.reason or ''}".strip()
    if exc.status == 401:
        how = (
            f"the {login.method} was rejected: it may be expired or minted for another audience "
            "(use --audience pipelines.kubeflow.org)"
            if login.method != "none"
            else f"no credentials were sent: pass --token or set {TOKEN_ENV} (multi-user Kubeflow), or pass "
            "--cookies with your Dex/oauth2-proxy session cookie"
        )
        return f"{what} at {login.host} refused the request ({status}: {detail}); {how}"
    if exc.status == 403:
        where = f"namespace {namespace!r}" if namespace else "this namespace"
        return (
            f"{what} at {login.host} denied access to {where} ({status}: {detail}); the identity behind the "
            f"{login.method} has no rights in {where}: check --namespace (your profile) and the profile's contributors"
        )
    return f"{what} at {login.host} answered {status}: {detail}"


def _api_error_message(body) -> str:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(body or "{}")
    except ValueError:
        return (body or "").strip()[:300]
    if isinstance(parsed, dict):
        return str(parsed.get("message") or parsed.get("error") or parsed)[:300]
    return str(parsed)[:300]


def run_url(host: str, run_id: str) -> str:
    return f"{host.rstrip('/')}/#/runs/details/{run_id}"


def name_filter(display_name: str) -> str:
    """The v2beta1 filter that selects objects by display name."""
    return json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "string_value": display_name}]}
    )


def typed_arguments(pipeline: str, raw: dict[str, str]) -> dict[str, Any]:
    """Command-line ``k=v`` strings -> the pipeline's parameter types, validated here before anything is sent."""
    from cifar10_kfp.params import coerce_params, validate_pipeline_params

    typed = coerce_params(raw, pipeline)
    validate_pipeline_params(typed, pipeline)  # fail now, not minutes later on the cluster
    return typed


def compile_for_submit(pipeline: str, *, no_cache: bool, workdir: str | Path, policy=None) -> Path:
    """Compile ``pipeline`` for the cluster. ``no_cache`` turns caching off in the spec itself,
    because the API ignores ``enable_caching`` for runs created from a pipeline id (kubeflow/pipelines#14253).
    """
    from cifar10_kfp_pipelines.catalog import compile_to, compiled_path
    from cifar10_kfp_pipelines.policy import ClusterPolicy

    policy = policy or ClusterPolicy()
    if no_cache:
        policy = replace(policy, cached_steps=frozenset())
    return compile_to(pipeline, compiled_path(pipeline, workdir), policy)


def ensure_experiment(client, name: str, namespace: str | None = None) -> str:
    """The id of experiment ``name``, created if missing."""
    try:
        return client.get_experiment(experiment_name=name, namespace=namespace).experiment_id
    except ValueError:  # kfp raises ValueError("No experiment is found with name ...")
        return client.create_experiment(name=name, namespace=namespace).experiment_id


def find_recurring_run(client, name: str, namespace: str | None = None):
    """The recurring run called ``name``; ValueError if there is none or more than one."""
    response = client.list_recurring_runs(page_size=100, namespace=namespace, filter=name_filter(name))
    found = [r for r in (response.recurring_runs or []) if r.display_name == name]
    if not found:
        raise ValueError(f"no recurring run named {name!r}: list them in the KFP UI under Recurring Runs")
    if len(found) > 1:
        raise ValueError(f"{len(found)} recurring runs are named {name!r}: delete the extras in the KFP UI")
    return found[0]


def temp_dir():
    return tempfile.TemporaryDirectory(prefix="cifar10-kfp-submit-")
