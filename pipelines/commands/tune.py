"""``cifar10-kfp tune``: run an Optuna study on a prepared dataset, without Kubeflow.

The same study as the ``cifar10-tune`` pipeline's tune step (``cifar10_kfp.tune.study``), with
the same parameters and checks (``cifar10_kfp.params``, pipeline ``tune``): the flags are
generated from the parameter rows. Its state goes to ``--study-uri`` (a local directory or
``s3://...``) after every trial, so running the command again with the same ``--study-uri``
resumes the study. ``--train`` then trains the best configuration for the full epochs.
"""

from __future__ import annotations

import argparse

HELP = (
    "tune hyperparameters with an Optuna study (TPE, random or grid; asha, median or hyperband pruning; "
    "an epoch budget); resumable"
)
# Pipeline parameters that are flags here: the study's own and the training settings trials start from.
_STUDY = ("search_space", "n_trials", "budget_epochs", "timeout_s", "sampler", "pruner", "min_resource",
          "reduction_factor", "trial_epochs")  # fmt: skip


def _flagged_params():
    from cifar10_kfp.params import CONFIG_KNOBS, TUNE_PARAMS

    names = {"preset", "extra_hparams", *_STUDY, *(knob.name for knob in CONFIG_KNOBS)}
    return [p for p in TUNE_PARAMS if p.name in names]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="prepared dataset: dataset.safetensors path, its dir, or s3:// URI"
    )
    for param in _flagged_params():
        default = "cpu" if param.name == "preset" else None
        # --val-fraction is not a flag: the dataset is already prepared; trials need its validation split
        parser.add_argument("--" + param.name.replace("_", "-"), type=param.kind, default=default,
                            help=param.description.replace("%", "%%"))  # fmt: skip
    parser.add_argument(
        "--study-uri", required=True,
        help="where the study's journal is kept (local dir or s3://...); the same URI resumes the study",
    )  # fmt: skip
    parser.add_argument(
        "--output-dir", required=True, help="best_params.json, metrics.json, report.html go here"
    )
    parser.add_argument(
        "--train",
        action="store_true",
        help="then train the best configuration (full epochs) into OUTPUT_DIR/final",
    )


def values_from_args(args: argparse.Namespace) -> dict:
    """The validated ``tune`` pipeline values of the flags given (defaults for the rest)."""
    from cifar10_kfp.params import validate_pipeline_params

    given = {p.name: getattr(args, p.name) for p in _flagged_params() if getattr(args, p.name) is not None}
    return validate_pipeline_params(given, "tune")


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.tune import run_study

    values = values_from_args(args)  # every check before the data is read
    result = run_study(values, args.data, args.output_dir, study_uri=args.study_uri)
    print(json.dumps({"best_params": result.best_params, **result.metrics}, indent=2, sort_keys=True))
    if args.train:
        from cifar10_kfp.params import train_config
        from cifar10_kfp.train import train

        final = train(train_config(result.best_training), args.data, f"{args.output_dir}/final")
        print(json.dumps(final.metrics, indent=2, sort_keys=True))
    return 0
