"""The first step of every pipeline: check every parameter in seconds, before any GPU pod.

The rules live in ``cifar10_kfp.params``, and so do the parameters: the components here
are generated from ``cifar10_kfp.params.signature`` and ``docstring``, so they take exactly
the pipeline's parameters. A lightweight component ships its function's *source* to the
container, so the source is generated too (``_component_source``) and registered in
``linecache`` under a pseudo file name: kfp reads it with ``inspect.getsource``, and the
compiled spec carries the same text the tests run.
"""

import linecache
from typing import NamedTuple

from kfp import dsl

from cifar10_kfp.params import docstring, signature
from cifar10_kfp_components.image import IMAGE

# The body of every validate component: all logic is in the library.
_BODY = """
    params = dict(locals())  # first statement: exactly the parameters
    from cifar10_kfp.params import validated_outputs
    from cifar10_kfp.runs import report_failures

    report_failures(bucket, storage_prefix)  # a refusal is recorded for the run summary
    outputs = validated_outputs(params, "{pipeline}")
    print("parameters are valid:", outputs[-1])
    return outputs
"""

_RAISES = """Raises:
    ValueError: naming the first bad parameter (or trial field) and its allowed range."""


def _component_source(function_name: str, pipeline: str, summary: str, outputs: dict) -> str:
    """The Python source of a validate component taking ``pipeline``'s parameters."""
    doc = docstring(pipeline, summary, sections=_returns_section(outputs) + "\n\n" + _RAISES)
    if '"""' in doc or "\\" in doc:
        raise ValueError(f"a parameter description of {pipeline!r} cannot go into a docstring: {doc!r}")
    params = "".join(
        f"    {name}: {p.annotation.__name__},\n" for name, p in signature(pipeline).parameters.items()
    )
    fields = ", ".join(f'("{name}", {kind.__name__})' for name, (kind, _) in outputs.items())
    tuple_name = "Validated" + pipeline.capitalize()
    indented_doc = "\n".join(f"    {line}" if line else "" for line in doc.splitlines())
    return (
        f'def {function_name}(\n{params}) -> NamedTuple("{tuple_name}", [{fields}]):\n'
        f'    """{indented_doc.lstrip()}\n    """{_BODY.format(pipeline=pipeline)}'
    )


def _returns_section(outputs: dict) -> str:
    return "Returns:\n" + "\n".join(f"    {name}: {text}" for name, (_, text) in outputs.items())


def _generated_component(function_name: str, pipeline: str, summary: str, outputs: dict):
    source = _component_source(function_name, pipeline, summary, outputs)
    filename = f"<generated {__name__}.{function_name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"__name__": __name__, "NamedTuple": NamedTuple}
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own generated source
    return dsl.component(base_image=IMAGE, install_kfp_package=False)(namespace[function_name])


_GPU_LIMIT = (
    str,
    "GPUs for each single-node train pod, as a string (the KFP driver reads resource counts as strings).",
)
_PARAMS_JSON = (str, "The validated, normalised parameters as JSON.")

validate_training_params = _generated_component(
    "validate_training_params",
    "training",
    "Validate the training pipeline's parameters.",
    {
        "gpu_limit": _GPU_LIMIT,
        "training": (dict, "The train step's settings (preset, knobs, extra_hparams), normalised."),
        "params_json": _PARAMS_JSON,
    },
)

validate_sweep_params = _generated_component(
    "validate_sweep_params",
    "sweep",
    "Validate the sweep pipeline's parameters and expand the trials.",
    {
        "gpu_limit": _GPU_LIMIT,
        "trials": (list, "One complete dict of training settings per trial, for ``dsl.ParallelFor``."),
        "params_json": _PARAMS_JSON,
    },
)

validate_tune_params = _generated_component(
    "validate_tune_params",
    "tune",
    "Validate the tune pipeline's parameters, the search space included.",
    {
        "gpu_limit": _GPU_LIMIT,
        "training": (
            dict,
            "The training settings every trial starts from (preset, knobs, extra_hparams), normalised.",
        ),
        "params_json": _PARAMS_JSON,
    },
)
