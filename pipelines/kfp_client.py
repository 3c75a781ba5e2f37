"""Talking to a Kubeflow Pipelines API server with ``kfp.Client``: shared by submit, schedule and runs."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

DEFAULT_EXPERIMENT = "cifar10-kfp"


def make_client(host: str, namespace: str = "kubeflow"):
    """A ``kfp.Client`` for ``host`` (e.g. http://localhost:8080 after a port-forward)."""
    import warnings

    import kfp

    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # "This client only works with KFP v2.0.0-beta.2 and later"
        return kfp.Client(host=host, namespace=namespace)


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
