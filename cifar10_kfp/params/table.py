"""The pipeline parameters: one table of names, types, defaults, descriptions and rules.

Everything else is derived from ``TRAINING_PARAMS`` / ``SWEEP_PARAMS`` / ``TUNE_PARAMS``: the pipelines'
signatures and docstrings (what the KFP UI shows, ``signature`` and ``docstring``), the
validate components, the ``cifar10-kfp train`` flags, and the one mapping from pipeline values
to a ``TrainConfig`` (``train_config``). A training knob has the name of its ``TrainConfig``
field everywhere: pipeline parameter, config field, CLI flag, metrics and docs.

To add a pipeline parameter, add one ``Param`` row below (``train=True`` if the train step needs
it in its settings dict; ``multi_node=True`` if only the TrainJob path uses it, which keeps it out
of the sweep), read it as ``p.<name>`` in the pipeline body, and recompile: the signatures, the
UI descriptions, the validate components and their checks follow from the row.

Validation (each value against its row, then the combinations) is ``cifar10_kfp.params.validation``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cifar10_kfp.params.checks as rule
from cifar10_kfp.data import CIFAR10_URL, MAX_VAL_FRACTION

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore
    from cifar10_kfp.train import TrainConfig

MAX_GPUS_PER_NODE = 16  # the largest GPU node shapes in common clouds
MAX_NODES = 64  # beyond this, the Trainer's rendezvous and our object-store checkpointing need tuning
MAX_SWEEP_TRIALS = 64
MAX_PARALLELISM = 32
MAX_TUNE_TRIALS = 1000


@dataclass(frozen=True)
class Param:
    """One pipeline parameter: its type, default, and the rule for its values."""

    name: str
    kind: type  # int, float or str: the KFP parameter type
    default: Any
    description: str  # what the KFP UI shows, and the CLI's help for the same knob
    check: rule.Check | None = None  # returns the allowed-range text when a value is bad
    train: bool = False  # handed to the train step: the preset, a TrainConfig field, or extra_hparams
    preset_default: bool = False  # the default ('' or 0) stands for the preset's value
    multi_node: bool = (
        False  # a setting of the multi-node (TrainJob) path; the sweep, one node a trial, has none
    )


def _knob(name: str, kind: type, description: str, check: rule.Check) -> Param:
    """A ``TrainConfig`` field as a pipeline parameter: ``''``/``0`` keeps the preset's value."""
    unset = kind()
    said = "empty" if kind is str else "0"
    return Param(
        name, kind, unset, f"{description}; {said} uses the preset's.", check, train=True, preset_default=True
    )


_P = Param
TRAINING_PARAMS: tuple[Param, ...] = (
    _P("dataset_uri", str, CIFAR10_URL,
       "Where the dataset archive is: http(s)://, s3://, minio://, file:// or a path. CIFAR-10 python or "
       "JPEG image-folder tar.gz.", rule.dataset_uri),
    _P("dataset_checksum", str, "",
       "Expected checksum of the archive: sha256:<64 hex> (prefix optional) or md5:<32 hex>; empty skips the check.",
       rule.checksum),
    _P("val_fraction", float, 0.1,
       f"Fraction of the training split held out for validation, in [0, {MAX_VAL_FRACTION:g}].",
       rule.float_range(0.0, MAX_VAL_FRACTION)),
    _P("max_train_samples", int, 0,
       "Use at most this many training images, stratified by class; 0 uses all.", rule.int_range(0, 10_000_000)),
    _P("max_test_samples", int, 0,
       "Use at most this many test images, stratified by class; 0 uses all.", rule.int_range(0, 10_000_000)),
    _P("image_size", int, 32,
       "Side in pixels the images are resized to, 8..512 (32 is CIFAR-10's native size).", rule.int_range(8, 512)),
    _P("skip_bad_images", int, 0,
       "1 leaves out image-folder images that cannot be decoded (counted and named in the prepared dataset's "
       "skipped_images); 0 fails on the first one, naming it.", rule.int_range(0, 1)),
    _P("preset", str, "fast",
       "Training preset: seed (baseline), fast (GPU speed run) or cpu (small, for CPU-only runs).", rule.preset,
       train=True),
    _knob("architecture", str, "Model architecture, e.g. simple_cnn or fast_resnet", rule.architecture),
    _knob("epochs", int, "Training epochs, 1..10000", rule.int_range(1, 10_000)),
    _knob("batch_size", int,
          "GLOBAL batch size: images per optimiser step over all GPUs and nodes together (each of N processes "
          "takes 1/N of it), 1..65536", rule.int_range(1, 65_536)),
    _knob("lr", float, "Peak learning rate, in (0, 10]", rule.float_range(0.0, 10.0, lo_open=True)),
    _P("seed", int, 0, "Random seed for data order, augmentation and initialisation, 0..2147483647.",
       rule.int_range(0, 2**31 - 1), train=True),
    _P("extra_hparams", str, "",
       "JSON object of further training-config overrides, e.g. {\"weight_decay\": 0.0005}; empty for none.",
       rule.extra_hparams, train=True),
    _knob("checkpoint_every", int, "Save a resumable checkpoint every N epochs, 1..10000",
          rule.int_range(1, 10_000)),
    _P("num_gpus", int, 1, f"GPUs per node for training, 0..{MAX_GPUS_PER_NODE} (0 trains on CPU).",
       rule.int_range(0, MAX_GPUS_PER_NODE)),
    _P("num_nodes", int, 1,
       f"Nodes to train on, 1..{MAX_NODES}; more than 1 hands training to a Kubeflow Trainer TrainJob.",
       rule.int_range(1, MAX_NODES), multi_node=True),
    _P("min_nodes", int, 0,
       "Elastic training: the TrainJob keeps training while at least this many of its num_nodes nodes are "
       "alive, 1..num_nodes; 0 means num_nodes (a fixed size).", rule.int_range(0, MAX_NODES), multi_node=True),
    _P("max_restarts", int, 3,
       "Times the TrainJob's nodes restart training after a failure such as a lost node, 0..100 (torchrun "
       "--max-restarts; a node joining does not count).", rule.int_range(0, 100), multi_node=True),
    _P("checkpoint_every_s", int, 600,
       "Also save a checkpoint whenever this many seconds have passed, inside epochs too, 0..86400; 0 saves "
       "per epoch only. After a lost node or a preemption at most this much training is redone.",
       rule.int_range(0, 86_400), train=True),
    _P("trainjob_timeout_h", float, 24.0,
       "Hours the multi-node TrainJob may take, in (0, 720]; then it is deleted and the step fails naming why.",
       rule.float_range(0.0, 720.0, lo_open=True), multi_node=True),
    _P("keep_trainjob", int, 0,
       "1 keeps the finished TrainJob for inspection; 0 deletes it once its outputs are collected.",
       rule.int_range(0, 1), multi_node=True),
    _P("service_account", str, "",
       "Service account of the TrainJob's node pods; empty keeps the training runtime's.",
       rule.kubernetes_name, multi_node=True),
    _P("image_pull_secrets", str, "",
       "Comma-separated secrets for pulling the image in the TrainJob's node pods; empty for none.",
       rule.kubernetes_names, multi_node=True),
    _P("checkpoint_uri", str, "",
       "Where checkpoints go (s3://bucket/key; each training configuration gets its own folder under it); "
       "empty derives it from the run id, so a retry resumes.", rule.checkpoint_uri),
    _P("min_accuracy", float, 0.5,
       "Publish only if test accuracy is at least this, in [0, 1], and not worse than the published champion.",
       rule.float_range(0.0, 1.0)),
    _P("model_name", str, "cifar10-classifier",
       "Name the model is published under (models/<name>/<version>).", rule.model_name),
    _P("model_registry_url", str, "",
       "Kubeflow Model Registry to register each published version in, http(s)://host[:port] (e.g. "
       "http://model-registry-service.kubeflow:8080); empty registers nothing. Publishing fails, with the "
       "version kept and latest unmoved, if the registry cannot register it.", rule.registry_url),
    _P("bucket", str, "", "Object-store bucket; empty uses CIFAR10_KFP_BUCKET (default mlpipeline).", rule.bucket),
    _P("storage_prefix", str, "",
       "Key prefix for everything the pipeline writes; empty uses CIFAR10_KFP_PREFIX, else "
       "private/<namespace>/cifar10-kfp/ in a Kubeflow profile namespace (where its identity may write), "
       "else cifar10-kfp/.",
       rule.storage_prefix),
)  # fmt: skip

# What the train step receives (one dict), and what one sweep trial may set.
TRAINING_KEYS = tuple(p.name for p in TRAINING_PARAMS if p.train)
# The parameters that set the TrainConfig field of the same name (also `cifar10-kfp train` flags).
CONFIG_KNOBS = tuple(p for p in TRAINING_PARAMS if p.train and p.name not in ("preset", "extra_hparams"))

DEFAULT_SWEEP_SETS = '[{"lr": 0.05}, {"lr": 0.1}, {"lr": 0.2}]'
_SWEEP_ONLY: tuple[Param, ...] = (
    _P("hparam_sets", str, DEFAULT_SWEEP_SETS,
       "JSON list of trials; each object may set " + ", ".join(TRAINING_KEYS) + " over the pipeline's values.",
       rule.json_list_of_objects(MAX_SWEEP_TRIALS, '[{"lr": 0.1}, {"lr": 0.2}]')),
)  # fmt: skip
# The sweep trains every trial on one node: Trainer jobs per trial would multiply cluster demand.
SWEEP_PARAMS: tuple[Param, ...] = tuple(p for p in TRAINING_PARAMS if not p.multi_node) + _SWEEP_ONLY

DEFAULT_SEARCH_SPACE = (
    '{"label_smoothing": {"high": 0.3, "low": 0.0, "type": "float"}, '
    '"lr": {"high": 1.0, "log": true, "low": 0.05, "type": "float"}}'
)
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "median", "hyperband", "none")
_TUNE_ONLY: tuple[Param, ...] = (
    _P("search_space", str, DEFAULT_SEARCH_SPACE,
       'JSON object: TrainConfig field -> {"type": "float"|"int", "low", "high", "log"} or {"type": '
       '"categorical", "choices": [...]}; the pipeline\'s training settings hold the other fields.'),
    _P("n_trials", int, 20, f"Trials the study runs (pruned ones count), 1..{MAX_TUNE_TRIALS}.",
       rule.int_range(1, MAX_TUNE_TRIALS)),
    _P("timeout_s", int, 0, "Stop starting trials after this many seconds, 0..604800; 0 for no limit.",
       rule.int_range(0, 604_800)),
    _P("budget_epochs", int, 0,
       "Stop starting trials once the trials have trained this many epochs in all, 0..10000000; 0 for no "
       "limit. A discrete space's study also ends when every configuration has been tried.",
       rule.int_range(0, 10_000_000)),
    _P("sampler", str, "tpe",
       "Optuna sampler: tpe (multivariate Bayesian), random, or grid (every configuration of a discrete "
       "space once, in a seeded random order).", rule.one_of(*SAMPLERS)),
    _P("pruner", str, "asha",
       "Stop unpromising trials early: asha (successive halving), median, hyperband or none. A trial is "
       "never stopped after its last epoch.", rule.one_of(*PRUNERS)),
    _P("min_resource", int, 1,
       "asha and hyperband: epochs every trial trains before it can be stopped (the first rung), 1..10000.",
       rule.int_range(1, 10_000)),
    _P("reduction_factor", int, 3,
       "asha and hyperband: rungs lie at min_resource x reduction_factor^k epochs and 1 in reduction_factor "
       "trials goes on from each, 2..10.", rule.int_range(2, 10)),
    _P("trial_epochs", int, 0,
       "Epochs each trial trains, 1..10000; 0 uses the training epochs. The final model trains the full epochs.",
       rule.int_range(0, 10_000)),
)  # fmt: skip
# The tune step runs its trials in one pod, and the final training on one node, like the sweep.
TUNE_PARAMS: tuple[Param, ...] = tuple(p for p in TRAINING_PARAMS if not p.multi_node) + _TUNE_ONLY
PIPELINE_PARAMS = {"training": TRAINING_PARAMS, "sweep": SWEEP_PARAMS, "tune": TUNE_PARAMS}

# Settings fixed when the pipeline is compiled, not run-time parameters: kfp 2.17's
# dsl.ParallelFor takes `parallelism` as a Python int (IR iterator_policy.parallelism_limit).
BUILD_PARAMS: dict[str, tuple[Param, ...]] = {
    "training": (),
    "tune": (),
    "sweep": (
        _P("parallelism", int, 2, f"Trials trained at the same time, 1..{MAX_PARALLELISM} (set at compile time).",
           rule.int_range(1, MAX_PARALLELISM)),
    ),
}  # fmt: skip


def pipeline_params(pipeline: str = "training") -> tuple[Param, ...]:
    """The parameters of ``pipeline`` (``training``, ``sweep`` or ``tune``), in signature order."""
    try:
        return PIPELINE_PARAMS[pipeline]
    except KeyError:
        raise ValueError(f"pipeline={pipeline!r}: use one of {', '.join(PIPELINE_PARAMS)}") from None


def defaults(pipeline: str = "training") -> dict[str, Any]:
    """The default value of every parameter of a pipeline."""
    return {p.name: p.default for p in pipeline_params(pipeline)}


# ------------------------------------------------------------------- generated interfaces


def signature(pipeline: str = "training", *, with_defaults: bool = True) -> inspect.Signature:
    """The pipeline's Python signature: names, annotations (int/float/str) and, optionally, defaults."""
    return inspect.Signature(
        [
            inspect.Parameter(
                p.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=p.default if with_defaults else inspect.Parameter.empty,
                annotation=p.kind,
            )
            for p in pipeline_params(pipeline)
        ]
    )


def docstring(pipeline: str, summary: str, *, sections: str = "") -> str:
    """A Google-style docstring: ``summary``, one ``Args`` line per parameter, then ``sections``."""
    args = "\n".join(f"    {p.name}: {p.description}" for p in pipeline_params(pipeline))
    return f"{summary}\n\nArgs:\n{args}\n" + (f"\n{sections.strip()}\n" if sections.strip() else "")


# ------------------------------------------------------------------------------- coercion


def _coerce(param: Param, value: Any) -> Any:
    """Convert ``value`` to the parameter's type, accepting the string forms a command line gives."""
    return rule.coerce(param.name, param.kind, value)


def coerce_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Type-convert known parameters (``"3"`` -> 3 for an int) without range checks; unknown names fail."""
    specs = {p.name: p for p in pipeline_params(pipeline)}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for the {pipeline} pipeline: use {', '.join(specs)}"
        )
    return {name: _coerce(specs[name], value) for name, value in params.items()}


# ------------------------------------------------------------------------------ validation


def _check(param: Param, value: Any, where: str = "") -> None:
    """Raise the ``name=value is out of range: use ...`` error when ``value`` breaks ``param``'s rule."""
    if param.check is None or (param.preset_default and value == param.default):
        return
    problem = param.check(value)
    if problem is None:
        return
    if problem.startswith(rule.NOT_VALID):  # malformed (e.g. not JSON), not out of range
        raise ValueError(f"{where}{param.name}={value!r} {problem}")
    if param.preset_default:
        unset = repr(param.default) if param.kind is str else "0"
        problem = f"use {unset} (the preset's default) or {problem.removeprefix('use ')}"
    raise ValueError(f"{where}{param.name}={value!r} is out of range: {problem}")


# -------------------------------------------------------------- pipeline values -> train step


def training_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The training settings (``TRAINING_KEYS``) out of a pipeline's values: what the train step gets."""
    return {key: values[key] for key in TRAINING_KEYS}


def training_overrides(training: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TrainConfig`` overrides of a training-settings dict: ``extra_hparams`` first, then each knob.

    A knob missing or left at ``''``/``0`` keeps the preset's value (the seed ``0`` is a seed);
    ``extra_hparams`` may be a JSON string
    (the pipeline's form) or a mapping (the CLI's ``--set``).
    """
    extra = training.get("extra_hparams") or {}
    overrides = json.loads(extra) if isinstance(extra, str) else dict(extra)
    if not isinstance(overrides, dict):
        raise ValueError(f"extra_hparams must be a JSON object, got {extra!r}")
    for param in CONFIG_KNOBS:
        value = training.get(param.name, param.default)
        if param.name in training and not (param.preset_default and value == param.default):
            overrides[param.name] = value
    return overrides


def train_config(training: Mapping[str, Any], searched: Mapping[str, Any] | None = None) -> TrainConfig:
    """The ``TrainConfig`` a training-settings dict stands for: the one mapping every train path uses.

    ``searched`` (a tuning trial's values) overrides every other setting, knobs included.
    """
    from cifar10_kfp.train.config import make_config

    return make_config(training["preset"], {**training_overrides(training), **(searched or {})})


def checkpoint_prefix(
    checkpoint_uri: str, run_id: str, config: TrainConfig, store: ObjectStore | None = None
) -> str:
    """Where a training run checkpoints: ``<checkpoint_uri>/<config hash>``, or one derived from the run id.

    The config hash is always part of it, so sweep trials (or runs with another configuration)
    sharing one ``checkpoint_uri`` never resume from each other's checkpoints. The derived one is
    under ``store``'s root (the run's bucket and prefix), else the environment's.
    """
    if checkpoint_uri:
        return f"{checkpoint_uri.rstrip('/')}/{config.config_hash()}"
    from cifar10_kfp.train.engine import default_checkpoint_uri

    return default_checkpoint_uri(run_id, config, store=store)
