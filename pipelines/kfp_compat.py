"""Every change this project makes to kfp's private internals, in one place, each behind a version guard.

kfp is pinned (``kfp==2.17.3`` in pyproject.toml). Each patch below was read against that version's
source; ``_may_patch`` applies it only when the installed kfp is that version and the patched
attribute still exists. On any other version the patch is skipped with a warning that says what
the user loses, so an upgrade never runs our code against internals nobody has read.
``tests/pipelines/test_kfp_compat.py`` proves each patch fixes what it claims and each guard holds.

* ``quick_task_settings``: building pipelines without ``inspect.stack()`` (compile, run-local).
* ``named_task_outputs``: kfp.local resolving *named* task outputs in ``dsl.If`` / ``ParallelFor``.
* ``print_restored``: kfp.local's swapped ``builtins.print`` not outliving a run.
* ``exported_local_run_id``: kfp.local's run id exported to the task processes, as pods get theirs.
* ``task_output_routed``: kfp.local's task output sent to per-task log files, not the console.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

VERIFIED_KFP_VERSION = "2.17.3"  # the kfp whose source each patch here was checked against
RUN_ID_ENV = "CIFAR10_KFP_RUN_ID"  # = cifar10_kfp.runs.RUN_ID_ENV


def _may_patch(patch: str, owner: object, attribute: str, loss: str) -> bool:
    """Whether ``patch`` may replace ``owner.attribute``; warns (saying what is lost) when it may not."""
    import kfp

    if kfp.__version__ != VERIFIED_KFP_VERSION:
        problem = f"it was verified against kfp {VERIFIED_KFP_VERSION} and kfp {kfp.__version__} is installed"
    elif not hasattr(owner, attribute):
        problem = f"kfp {kfp.__version__} has no {getattr(owner, '__name__', owner)}.{attribute}"
    else:
        return True
    warnings.warn(f"cifar10-kfp: {patch} not applied: {problem}; {loss}", RuntimeWarning, stacklevel=3)
    return False


@contextlib.contextmanager
def _replaced(owner: object, attribute: str, replacement) -> Iterator[None]:
    original = getattr(owner, attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


@contextlib.contextmanager
def quick_task_settings() -> Iterator[None]:
    """Build pipelines without kfp 2.17's ``inspect.stack()`` in every task-setting call.

    ``PipelineTask._ensure_container_spec_exists`` (called by ``set_cpu_limit``,
    ``set_env_variable`` and the other container settings) takes ``inspect.stack()[1][3]``, the
    caller's name, for the message it raises on a task without a container. ``inspect.stack``
    reads the source of every frame and scans ``sys.modules`` for each, so building the training
    pipeline (about 150 such calls) took 0.5 s, and 1.5 s once torch is imported: time every
    ``run-local`` and ``compile`` paid. ``sys._getframe(1).f_code.co_name`` is the same name; the
    check and the message are kfp's, unchanged.
    """
    from kfp.dsl.pipeline_task import PipelineTask

    if "_ensure_container_spec_exists" not in PipelineTask.__dict__ or not _may_patch(
        "quick_task_settings", PipelineTask, "_ensure_container_spec_exists", "building a pipeline is slower"
    ):
        yield
        return

    def _ensure_container_spec_exists(self) -> None:
        if self.container_spec is None:
            caller = sys._getframe(1).f_code.co_name
            raise ValueError(
                f"{caller} can only be used on single-step components, not pipelines used as components, "
                "or special components like importers."
            )

    with _replaced(PipelineTask, "_ensure_container_spec_exists", _ensure_container_spec_exists):
        yield


@contextlib.contextmanager
def named_task_outputs() -> Iterator[None]:
    """Let kfp.local resolve *named* task outputs in ``dsl.If`` conditions and ``ParallelFor`` items.

    Its enhanced orchestrator turns a channel such as ``pipelinechannel--gate-model-passed`` into
    a task-output lookup only when the output is called ``Output``; for any other name it looks
    for a parent (DAG) input of that name. For a condition the miss is logged ("Could not resolve
    CEL parameter") and the condition is taken as False, silently skipping the branch (publish);
    for ``ParallelFor(items=task.outputs["trials"])`` it raises "Parent pipeline input argument
    ... not found". Both lookups end in ``IOStore.get_parent_input``; on a miss, this resolves
    ``[pipelinechannel--]<task>-<output>`` against the outputs the run has produced, walking up
    the enclosing DAGs. A key that resolved before resolves the same way.
    """
    from kfp.local import io

    if not _may_patch(
        "named_task_outputs", io.IOStore, "get_parent_input",
        "locally, the publish branch is skipped and the sweep's ParallelFor fails",
    ):  # fmt: skip
        yield
        return
    original = io.IOStore.get_parent_input

    def get_parent_input(self, key: str):
        try:
            return original(self, key)
        except ValueError:
            wanted = key.removeprefix("pipelinechannel--")
            scope = self
            while scope is not None:
                for task, outputs in scope._task_output_data.items():
                    for name, value in outputs.items():
                        if f"{task}-{name}" == wanted:
                            return value
                scope = scope._parent
            raise

    with _replaced(io.IOStore, "get_parent_input", get_parent_input):
        yield


@contextlib.contextmanager
def print_restored() -> Iterator[None]:
    """Put ``builtins.print`` back after a kfp.local run.

    kfp.local indents task logs by swapping ``builtins.print`` inside each task. Iterations of a
    ``ParallelFor`` run in threads, so the save/restore pairs interleave and an indented ``print``
    can outlive the run, indenting everything the caller (a notebook, a test) prints afterwards.
    """
    import builtins

    from kfp.local import logging_utils

    guarded = _may_patch(
        "print_restored", logging_utils, "indented_print", "a notebook may keep kfp.local's indented print"
    )
    original = builtins.print
    try:
        yield
    finally:
        if guarded:
            builtins.print = original


@contextlib.contextmanager
def exported_local_run_id() -> Iterator[dict[str, str]]:
    """Export kfp.local's run id to the task processes as ``CIFAR10_KFP_RUN_ID``; yield ``{"run_id": ...}``.

    On a cluster every pod of a run carries the label ``pipeline/runid`` (the KFP API server sets it as
    pod metadata, kubeflow/pipelines backend/src/apiserver/template/v2_template.go), and
    ``ClusterPolicy`` exposes it to each step as ``CIFAR10_KFP_RUN_ID`` through the downward API:
    steps that take no ``run_id`` input (so that cached steps keep their cache key) still know
    where their run records go. kfp.local draws the run id (the value of
    ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``) in ``pipeline_orchestrator`` and passes it to
    ``run_enhanced_dag(unique_pipeline_id=...)``; this puts it into ``os.environ``, which the task
    subprocesses inherit, before the first task starts, and restores the variable afterwards.
    """
    from kfp.local.orchestrator import enhanced_dag_orchestrator

    seen: dict[str, str] = {}
    if not _may_patch(
        "exported_local_run_id", enhanced_dag_orchestrator, "run_enhanced_dag",
        "locally, a failing step cannot record its error for the run summary",
    ):  # fmt: skip
        yield seen
        return
    original = enhanced_dag_orchestrator.run_enhanced_dag
    saved = os.environ.get(RUN_ID_ENV)

    def run_enhanced_dag(*args, **kwargs):
        run_id = kwargs.get("unique_pipeline_id")
        if run_id:
            seen.setdefault("run_id", run_id)
            os.environ[RUN_ID_ENV] = run_id
        return original(*args, **kwargs)

    try:
        with _replaced(enhanced_dag_orchestrator, "run_enhanced_dag", run_enhanced_dag):
            yield seen
    finally:
        if saved is None:
            os.environ.pop(RUN_ID_ENV, None)
        else:
            os.environ[RUN_ID_ENV] = saved


@contextlib.contextmanager
def task_output_routed(console) -> Iterator[None]:
    """Send kfp.local's task output to ``console`` (a ``local_console.TaskConsole``) instead of stdout.

    kfp 2.17.3 runs each task through ``task_executor.execute_single_task`` (cache lookup, retries),
    which calls ``task_dispatcher.run_single_task_implementation`` for each attempt that really runs;
    that one installs a stdout logger (``logging_utils.local_logger_context``), logs the executor
    input and outputs, and streams the task process's output with ``print`` from
    ``subprocess_task_handler.run_local_subprocess``. This wraps the first two (task start, end and
    cache hit), replaces the streaming with ``console.task_line`` per line (same process, same
    environment, same exit code), and makes the logger context and the separator lines
    (``logging_utils.print_horizontal_line``) leave the caller's logging alone.
    """
    from kfp.local import logging_utils, subprocess_task_handler, task_dispatcher
    from kfp.local.orchestrator import task_executor

    targets = [
        (task_executor, "execute_single_task"), (task_dispatcher, "run_single_task_implementation"),
        (subprocess_task_handler, "run_local_subprocess"), (logging_utils, "local_logger_context"),
        (logging_utils, "print_horizontal_line"),
    ]  # fmt: skip
    loss = "run-local prints kfp.local's whole output, as with --verbose"
    if not all(_may_patch("task_output_routed", owner, name, loss) for owner, name in targets):
        yield
        return
    execute_original = task_executor.execute_single_task
    dispatch_original = task_dispatcher.run_single_task_implementation

    def execute_single_task(*args, **kwargs):
        with console.task(kwargs.get("task_name") or str(args[0])) as outcome:
            outputs, task_status = execute_original(*args, **kwargs)
            outcome["status"] = getattr(task_status, "name", str(task_status))
            return outputs, task_status

    def run_single_task_implementation(*args, **kwargs):
        console.task_started()
        return dispatch_original(*args, **kwargs)

    def run_local_subprocess(full_command, env_vars=None) -> int:
        import subprocess

        env = {**os.environ, **env_vars} if env_vars else None
        with subprocess.Popen(full_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              bufsize=1, env=env, errors="replace") as process:  # fmt: skip
            assert process.stdout is not None  # stdout=PIPE
            for line in iter(process.stdout.readline, ""):
                console.task_line(line)
            return process.wait()

    @contextlib.contextmanager
    def local_logger_context():
        yield

    replacements = [execute_single_task, run_single_task_implementation, run_local_subprocess,
                    local_logger_context, lambda: None]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for (owner, name), replacement in zip(targets, replacements):
            stack.enter_context(_replaced(owner, name, replacement))
        yield
