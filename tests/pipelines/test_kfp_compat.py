"""Each kfp private-API patch (pipelines/kfp_compat.py): it fixes what it claims on the pinned kfp, is undone
afterwards, and is not applied (with a warning saying what is lost) on a kfp it was not verified against."""

import builtins
import os
from typing import NamedTuple

import kfp
import pytest
from kfp import dsl, local

from cifar10_kfp_pipelines import kfp_compat
from cifar10_kfp_pipelines.policy import ClusterPolicy


@pytest.fixture
def kfp_local(tmp_path):
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def decide(value: int) -> NamedTuple("Decision", [("passed", bool), ("reason", str)]):  # not named "Output"
    from collections import namedtuple

    return namedtuple("Decision", ["passed", "reason"])(
        value > 0, "positive" if value > 0 else "not positive"
    )


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def report_run_id(run_id: str, path: str):
    import os

    with open(path, "w") as fh:
        fh.write(f"{run_id}|{os.environ.get('CIFAR10_KFP_RUN_ID', '')}")


@dsl.pipeline(name="named-output-branch")
def named_output_branch(value: int, path: str):
    decision = decide(value=value)
    with dsl.If(decision.outputs["passed"] == True):  # noqa: E712 - a KFP condition
        report_run_id(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, path=path)


def test_kfp_is_the_version_the_patches_were_verified_against():
    assert kfp.__version__ == kfp_compat.VERIFIED_KFP_VERSION, "re-read each patch against the new kfp first"


@pytest.mark.parametrize("patch", ["quick_task_settings", "named_task_outputs", "print_restored",
                                   "exported_local_run_id"])  # fmt: skip
def test_a_patch_is_skipped_with_a_warning_on_another_kfp(patch, monkeypatch):
    from kfp.dsl.pipeline_task import PipelineTask
    from kfp.local import io
    from kfp.local.orchestrator import enhanced_dag_orchestrator

    before = (PipelineTask._ensure_container_spec_exists, io.IOStore.get_parent_input,
              enhanced_dag_orchestrator.run_enhanced_dag)  # fmt: skip
    monkeypatch.setattr(kfp, "__version__", "2.99.0")
    with pytest.warns(RuntimeWarning, match=f"{patch} not applied: it was verified against kfp 2.17.3"):
        with getattr(kfp_compat, patch)():
            assert (PipelineTask._ensure_container_spec_exists, io.IOStore.get_parent_input,
                    enhanced_dag_orchestrator.run_enhanced_dag) == before  # fmt: skip


def test_quick_task_settings_builds_without_walking_the_stack(monkeypatch):
    """kfp's task settings call inspect.stack() (slow: the source of every frame); the builders avoid it."""
    import inspect

    from cifar10_kfp_pipelines.sweep import build_sweep_pipeline
    from cifar10_kfp_pipelines.training import build_training_pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("inspect.stack() called while building a pipeline")

    monkeypatch.setattr(inspect, "stack", refuse)
    build_training_pipeline(ClusterPolicy())
    build_sweep_pipeline(ClusterPolicy())


def test_quick_task_settings_keeps_kfps_error_for_a_task_without_a_container():
    @dsl.pipeline(name="inner")
    def inner():
        decide(value=1)

    def message() -> str:
        errors = []

        @dsl.pipeline(name="outer")
        def outer():
            with pytest.raises(ValueError) as caught:
                inner().set_cpu_limit("1")  # a pipeline used as a component
            errors.append(str(caught.value))

        return errors[0]

    plain = message()
    with kfp_compat.quick_task_settings():
        quick = message()
    assert quick == plain
    assert plain.startswith("set_cpu_limit can only be used on single-step components")


def test_named_task_outputs_lets_kfp_local_take_a_branch_on_a_named_output(kfp_local, tmp_path):
    skipped, taken = tmp_path / "skipped", tmp_path / "taken"
    named_output_branch(value=3, path=str(skipped))
    assert not skipped.exists()  # unpatched, kfp.local 2.17.3 silently skips the branch
    with kfp_compat.named_task_outputs():
        named_output_branch(value=3, path=str(taken))
    assert taken.read_text().split("|")[0]  # the branch ran and reported the run id
    from kfp.local import io

    assert io.IOStore.get_parent_input.__name__ == "get_parent_input"
    assert io.IOStore.get_parent_input.__qualname__ == "IOStore.get_parent_input"  # restored


def test_exported_local_run_id_matches_the_pipeline_job_id_placeholder(kfp_local, monkeypatch, tmp_path):
    monkeypatch.delenv(kfp_compat.RUN_ID_ENV, raising=False)
    with kfp_compat.named_task_outputs(), kfp_compat.exported_local_run_id() as seen:
        named_output_branch(value=1, path=str(tmp_path / "ids"))
    placeholder, from_env = (tmp_path / "ids").read_text().split("|")
    assert placeholder and placeholder == from_env == seen["run_id"]
    assert kfp_compat.RUN_ID_ENV not in os.environ  # restored


def test_print_restored_undoes_a_print_left_swapped():
    original = builtins.print
    with kfp_compat.print_restored():
        builtins.print = lambda *args, **kwargs: None  # what an interleaved kfp.local ParallelFor can leave
    assert builtins.print is original


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def chatty(value: int) -> int:
    print("a line only the task log should hold")
    print("    epoch train_loss train_acc  val_acc        lr     img/s   elapsed       eta")
    return value + 1


@dsl.pipeline(name="chatty-pipeline")
def chatty_pipeline(value: int) -> int:
    return chatty(value=value).output


def _kfp_local_internals():
    from kfp.local import logging_utils, subprocess_task_handler, task_dispatcher
    from kfp.local.orchestrator import task_executor

    return (task_executor.execute_single_task, task_dispatcher.run_single_task_implementation,
            subprocess_task_handler.run_local_subprocess, logging_utils.local_logger_context,
            logging_utils.print_horizontal_line)  # fmt: skip


def test_task_output_routed_sends_task_output_to_its_log_and_shows_start_end_and_progress(
    kfp_local, tmp_path, capsys
):
    import io

    from cifar10_kfp_pipelines.local_console import TaskConsole

    before = _kfp_local_internals()
    shown = io.StringIO()
    console = TaskConsole(tmp_path / "logs", shown)
    with kfp_compat.task_output_routed(console):
        assert chatty_pipeline(value=1).output == 2
    console.close()
    assert _kfp_local_internals() == before  # undone afterwards
    lines = shown.getvalue().splitlines()
    assert lines[0] == "[chatty] started" and lines[-1].startswith("[chatty] done in ")
    assert any(line.strip().startswith("epoch train_loss") for line in lines)  # a progress line is shown
    assert len(lines) == 3
    log = (tmp_path / "logs" / "chatty.log").read_text()
    assert "a line only the task log should hold" in log and "executor_input" in log.lower()
    assert "a line only the task log should hold" not in capsys.readouterr().out


def test_task_output_routed_is_skipped_with_a_warning_on_another_kfp(monkeypatch, tmp_path):
    from cifar10_kfp_pipelines.local_console import TaskConsole

    before = _kfp_local_internals()
    monkeypatch.setattr(kfp, "__version__", "2.99.0")
    with pytest.warns(RuntimeWarning, match="task_output_routed not applied.*as with --verbose"):
        with kfp_compat.task_output_routed(TaskConsole(tmp_path)):
            assert _kfp_local_internals() == before
