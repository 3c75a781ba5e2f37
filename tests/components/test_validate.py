"""The validate components, generated from cifar10_kfp.params: their interface is the parameter table,
the source kfp ships to the container is that generated function, and it runs under kfp.local."""

from __future__ import annotations

import inspect
import json

import pytest

from cifar10_kfp.params.table import defaults, pipeline_params, signature
from cifar10_kfp_components.validate import validate_sweep_params, validate_training_params

COMPONENTS = [("training", validate_training_params), ("sweep", validate_sweep_params)]
KINDS = {int: "Integer", float: "Float", str: "String"}


@pytest.mark.parametrize(("pipeline", "component"), COMPONENTS)
def test_inputs_are_the_pipeline_parameters_with_their_types_and_descriptions(pipeline, component):
    inputs = component.component_spec.inputs
    assert list(inputs) == [p.name for p in pipeline_params(pipeline)]
    for param in pipeline_params(pipeline):
        spec = inputs[param.name]
        assert (spec.type, spec.optional, spec.description) == (KINDS[param.kind], False, param.description)
    assert list(component.component_spec.outputs) == [
        "gpu_limit",
        "training" if pipeline == "training" else "trials",
        "params_json",
    ]


@pytest.mark.parametrize(("pipeline", "component"), COMPONENTS)
def test_the_shipped_source_defines_the_generated_signature(pipeline, component):
    """kfp ships the function's source text; executing that text gives the same parameters."""
    program = component.component_spec.implementation.container.command[-1]
    name = component.python_func.__name__
    assert f"def {name}(\n" in program and "dict(locals())" in program
    namespace: dict = {}
    exec(compile(program, "<shipped>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the component's own program
    shipped = inspect.signature(namespace[name])
    assert [(p.name, p.annotation) for p in shipped.parameters.values()] == [
        (p.name, p.annotation) for p in signature(pipeline, with_defaults=False).parameters.values()
    ]
    assert inspect.getdoc(namespace[name]) == inspect.getdoc(component.python_func)


def test_python_func_returns_the_train_steps_settings():
    gpu_limit, training, params_json = validate_training_params.python_func(
        **defaults() | {"preset": "cpu", "architecture": "simple_cnn", "lr": 0.05, "num_gpus": 2}
    )
    assert gpu_limit == "2"
    assert training == {
        "preset": "cpu", "architecture": "simple_cnn", "epochs": 0, "batch_size": 0, "lr": 0.05, "seed": 0,
        "extra_hparams": "", "checkpoint_every": 0, "checkpoint_every_s": 600,
    }  # fmt: skip
    assert json.loads(params_json)["lr"] == 0.05
    with pytest.raises(ValueError, match=r"^epochs=-1 is out of range"):
        validate_training_params.python_func(**defaults() | {"epochs": -1})


def test_sweep_trials_carry_every_training_setting():
    _, trials, _ = validate_sweep_params.python_func(
        **defaults("sweep") | {"hparam_sets": '[{"lr": 0.1}, {"architecture": "simple_cnn", "seed": 3}]'}
    )
    assert [(t["lr"], t["architecture"], t["seed"]) for t in trials] == [(0.1, "", 0), (0.0, "simple_cnn", 3)]


@pytest.mark.slow
def test_kfp_local_runs_the_generated_component(tmp_path):
    """The generated program, as kfp.local's subprocess runs it: good values pass, a bad one fails."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    task = validate_training_params(**defaults() | {"epochs": 3, "batch_size": 512, "preset": "cpu"})
    assert task.outputs["gpu_limit"] == "1"
    assert task.outputs["training"]["epochs"] == 3 and task.outputs["training"]["batch_size"] == 512
    assert json.loads(task.outputs["params_json"])["preset"] == "cpu"
    with pytest.raises(RuntimeError, match="FAILURE"):
        validate_training_params(**defaults() | {"batch_size": -4})
