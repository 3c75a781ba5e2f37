"""Run a pipeline on this machine with ``kfp.local.SubprocessRunner``, on a real S3 store.

``run_local(pipeline="training", params={...}) -> dict`` is the Python API (notebooks call it);
``cifar10-kfp run-local`` is the command (``make run`` calls it). Both run the *same* pipeline
definition that ``compile`` writes for Kubeflow, built with ``ClusterPolicy.for_local``: the
only differences are the object-store endpoint (the local one) and no task retries.

The object store is ``MINIO_ENDPOINT`` when that is set, otherwise an embedded SeaweedFS server
started for the run (its variables are exported to the step subprocesses through
``os.environ``) and stopped at the end, even on failure; its data stays in
``<output_root>/object-store``, so the dataset cache, checkpoints and published models outlive the run.

kfp.local 2.17 behaviour this relies on (checked in its source): ``dsl.ExitHandler`` tasks run
after the body, with ``PipelineTaskFinalStatus``; ``dsl.If``/``dsl.Else`` and ``ParallelFor``
(at most 2 iterations at a time) and ``dsl.Collected`` run; ``PIPELINE_JOB_ID_PLACEHOLDER``
becomes a random id shared by the run's tasks; resource, accelerator and Kubernetes platform
settings (secrets, tolerations) are ignored with a warning; ``set_env_variable`` applies.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_ROOT = Path("local_outputs")
STORE_DIR_NAME = "object-store"  # the embedded store's data, under the output root
SUMMARY_TASK = "write-run-summary"


@contextlib.contextmanager
def object_store_env(data_dir: str | os.PathLike | None = None) -> Iterator[dict[str, str]]:
    """Yield the MINIO_* settings to use; start (and always stop) an embedded store if none is set."""
    if os.environ.get("MINIO_ENDPOINT"):
        yield {k: v for k, v in os.environ.items() if k.startswith("MINIO_")}
        return
    from cifar10_kfp.storage import EmbeddedObjectStore

    server = EmbeddedObjectStore(data_dir)
    started = time.monotonic()
    server.start()
    start_s = time.monotonic() - started
    saved = {key: os.environ.get(key) for key in server.env()}
    try:
        os.environ.update(server.env())  # kfp.local's subprocesses inherit os.environ
        log.info(
            "started an embedded S3 server on %s in %.1f s (data in %s)",
            server.endpoint,
            start_s,
            server.data_dir,
        )
        yield server.env()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()
        if data_dir is None:
            server.close()


def _resolve_params(pipeline: str, params: dict[str, Any], validate: bool = True):
    """Split into run-time parameters (typed; validated and complete unless ``validate`` is False)
    and compile-time settings."""
    from cifar10_kfp.params import (
        BUILD_PARAMS,
        coerce_params,
        validate_build_params,
        validate_pipeline_params,
    )

    build_names = {p.name for p in BUILD_PARAMS[pipeline]}
    build = validate_build_params({k: v for k, v in params.items() if k in build_names}, pipeline)
    run = {k: v for k, v in params.items() if k not in build_names}
    # Validate here too: a bad value fails before a server starts; the pipeline validates again.
    values = validate_pipeline_params(run, pipeline) if validate else coerce_params(run, pipeline)
    _refuse_multi_node(values)
    return values, build


def _refuse_multi_node(values: dict[str, Any]) -> None:
    """num_nodes > 1 is valid on a cluster but cannot run here: refused before anything starts, not at
    the train step after the download and preprocess steps have run."""
    nodes = values.get("num_nodes", 1)
    if isinstance(nodes, int) and nodes > 1:
        raise ValueError(
            f"num_nodes={nodes} cannot run locally: run-local runs every step on this one machine, and "
            "more than one node hands training to a Kubeflow Trainer TrainJob, which needs a cluster. Use "
            "num_nodes=1 here (num_gpus=N for several GPUs of this machine), or `cifar10-kfp submit --param "
            f"num_nodes={nodes} ...` to a cluster (docs/multi-node.md)"
        )


# Device nodes of the GPU drivers torch can use on Linux: NVIDIA (Jetson's too), AMD ROCm, WSL.
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvhost-*", "/dev/nvgpu*", "/dev/nvmap", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, answered without importing torch on Linux without a GPU driver.

    Importing torch costs this process about a second, and a process with torch loaded then
    builds the pipeline more slowly (kfp walks ``sys.modules``); no task of it needs torch here.
    """
    if sys.platform.startswith("linux") and not any(glob.glob(pattern) for pattern in GPU_DEVICE_GLOBS):
        return False
    import torch

    return torch.cuda.is_available()


def local_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """On a machine without CUDA, default to the ``cpu`` preset and no GPUs (unless the caller chose)."""
    if "preset" in params and "num_gpus" in params:
        return params  # nothing left to default, so no need to ask about CUDA
    if cuda_available():
        return params
    chosen = dict(params)
    if "preset" not in chosen:
        chosen["preset"] = "cpu"
        log.info("no CUDA device: using preset=cpu (pass preset=... to choose another)")
    chosen.setdefault("num_gpus", 0)
    return chosen


def _find_task_dir(run_root: Path, task: str) -> Path | None:
    matches = sorted(run_root.glob(f"*/{task}"), key=lambda p: p.stat().st_mtime)
    return matches[-1] if matches else None


def _read_summary(run_root: Path) -> dict | None:
    """The JSON the exit-handler task wrote (its ``summary`` output artifact), if it ran."""
    task_dir = _find_task_dir(run_root, SUMMARY_TASK)
    if task_dir is None or not (task_dir / "summary").is_file():
        return None
    return json.loads((task_dir / "summary").read_text())


def run_local(
    pipeline: str = "training",
    params: dict[str, Any] | None = None,
    *,
    output_root: str | os.PathLike = DEFAULT_OUTPUT_ROOT,
    summary_json: str | os.PathLike | None = None,
    store_data_dir: str | os.PathLike | None = None,
    validate_first: bool = True,
    verbose: bool = False,
) -> dict:
    """Run ``pipeline`` locally; return the run summary (see ``cifar10-kfp run-local --help``).

    Without CUDA, ``preset`` defaults to ``cpu`` and ``num_gpus`` to 0 unless given.
    Never raises for a pipeline failure: the summary's ``status`` is ``"FAILED"`` and ``error``
    says which task failed. Raises ``ValueError`` for bad parameters, before anything starts;
    ``validate_first=False`` skips that early check (bad values then fail in the pipeline's own
    validate step, as on a cluster). Unless ``verbose``, the console gets one line per task start
    and end and the progress lines; each task's whole output goes to ``<run>/logs/<task>.log``.
    """
    from kfp import local

    from cifar10_kfp.storage import StorageConfig, check_credentials
    from cifar10_kfp_pipelines.catalog import build, resolve
    from cifar10_kfp_pipelines.kfp_compat import exported_local_run_id, named_task_outputs, print_restored
    from cifar10_kfp_pipelines.local_console import quiet_output
    from cifar10_kfp_pipelines.policy import ClusterPolicy

    short = resolve(pipeline)
    # The embedded store keeps its data under the output root, so downloads stay cached across runs
    # and what a run published or checkpointed is still there afterwards (`cifar10-kfp store --data-dir`).
    if store_data_dir is None and not os.environ.get("MINIO_ENDPOINT"):
        store_data_dir = Path(output_root).resolve() / STORE_DIR_NAME
    values, build_params = _resolve_params(short, local_defaults(dict(params or {})), validate=validate_first)
    run_root = Path(output_root).resolve() / f"{short}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    error = ""
    with object_store_env(store_data_dir) as store_env:
        # Refused (strict mode) or warned about (the well-known pair) once, here, before any task starts.
        check_credentials(StorageConfig.from_env({**os.environ, **store_env}))
        endpoint = store_env["MINIO_ENDPOINT"]
        secure = store_env.get("MINIO_SECURE", "false").lower() in ("1", "true", "yes")
        pipeline_func = build(short, ClusterPolicy.for_local(endpoint, minio_secure=secure), **build_params)
        local.init(
            runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(run_root), raise_on_error=True
        )
        log_dir = run_root / "logs"
        console = contextlib.nullcontext() if verbose else quiet_output(log_dir)
        if not verbose:
            print(f"running cifar10-{short} locally; each task's full log goes to {log_dir}/", flush=True)
        try:
            with print_restored(), named_task_outputs(), exported_local_run_id(), warnings.catch_warnings(), \
                    console as task_console:  # fmt: skip
                # Resources, accelerators, display names and Kubernetes settings are for the cluster;
                # kfp.local warns once per task that it ignores them.
                warnings.filterwarnings("ignore", message=".*no effect in the current local runner.*")
                warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
                pipeline_func(**values)
        except (
            RuntimeError
        ) as exc:  # kfp.local: "Pipeline ... finished with status FAILURE. Inner task failed: ..."
            error = _plain(str(exc))
        summary = _read_summary(run_root)
    summary = _with_local_failure(summary, error)
    if not verbose and task_console is not None:  # quiet_output's console (None only when verbose)
        _name_the_logs(summary, log_dir, task_console.task_logs)
    summary.update(
        pipeline=f"cifar10-{short}",
        parameters={**values, **build_params},
        local_root=str(run_root),
        wall_s=round(time.monotonic() - started, 1),
    )
    summary.setdefault("published", None)
    if store_data_dir is not None:
        summary["object_store_data"] = str(store_data_dir)
    if summary_json:
        path = Path(summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def _with_local_failure(summary: dict | None, error: str) -> dict:
    """The exit handler's summary, made to agree with kfp.local's own verdict ``error`` ("" if none).

    The summary names the failing task and its error when the task recorded them; kfp.local's
    message ("... Inner task failed: 'download-dataset' inside 'exit-handler-1'") fills in only
    what the summary lacks.
    """
    import re

    if summary is None:
        summary = {"status": "FAILED", "failed_task": "", "error": error or "the run-summary task did not run",
                   "metrics": {}, "published": None, "artifacts": {}}  # fmt: skip
    if error:
        summary["status"] = "FAILED"
        if not summary.get("failed_task"):
            inner = re.search(r"Inner task failed: '([^']+)'", error)
            summary["failed_task"] = inner.group(1) if inner else ""
            summary["error"] = error
    return summary


def _name_the_logs(summary: dict, log_dir: Path, task_logs: dict[str, Path]) -> None:
    """Add where the logs are; a failure no step recorded takes its error from the failed task's log."""
    from cifar10_kfp_pipelines.local_console import last_exception

    summary["logs"] = str(log_dir)
    failed = summary.get("failed_task") or ""
    if failed and failed in task_logs:
        summary["failed_task_log"] = str(task_logs[failed])
        if "Inner task failed" in (summary.get("error") or "") or not summary.get("error"):
            summary["error"] = last_exception(task_logs[failed]) or summary.get("error", "")


def _plain(text: str) -> str:
    """Strip the ANSI colours kfp.local puts in its messages."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _as_typed(path: str) -> str:
    """``path`` as a user would type it here: relative when under the working directory."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def format_summary(summary: dict) -> str:
    """The final table ``run-local`` prints: status, metrics and where everything is.

    A failed run ends with its failing step, the error (and its innermost cause) and that step's
    log, the lines a reader looks at first.
    """
    rows = [("status", summary.get("status", "?")), ("pipeline", summary.get("pipeline", ""))]
    for key, value in sorted((summary.get("metrics") or {}).items()):
        rows.append((key, f"{value:.4f}" if isinstance(value, float) else json.dumps(value)))
    from cifar10_kfp.runs import recorded_cause, unpublished_reason

    published = summary.get("published")
    rows.append(("published", f"{published['uri']} (version {published['version']})" if published
                 else f"no ({unpublished_reason(summary)})"))  # fmt: skip
    if published and published.get("model_registry"):
        registered = published["model_registry"]
        rows.append(("model registry", f"{registered['registry_uri']} at {registered['url']}"))
    rows += [(key, str(value)) for key, value in sorted((summary.get("artifacts") or {}).items()) if value]
    if summary.get("object_store_data"):
        rows.append(
            (
                "object store",
                f"{summary['object_store_data']} (browse: cifar10-kfp store --data-dir "
                f"{_as_typed(summary['object_store_data'])})",
            )  # fmt: skip
        )
    rows += [(label, summary[key]) for label, key in (("local outputs", "local_root"), ("logs", "logs"))
             if summary.get(key)]  # fmt: skip
    if summary.get("status") != "SUCCEEDED":
        rows += [("failed step", summary.get("failed_task") or "?"), ("error", summary.get("error") or "?")]
        cause = recorded_cause(summary)
        rows += [("caused by", cause)] if cause else []
        rows += [("failed step log", summary["failed_task_log"])] if summary.get("failed_task_log") else []
    width = max(len(k) for k, _ in rows)
    line = "-" * min(100, width + 60)
    return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])
