"""``cifar10-kfp train``: train a classifier on a prepared dataset, locally, with checkpoints.

The knob flags (``--architecture``, ``--epochs``, ``--batch-size``, ``--lr``, ``--seed``,
``--checkpoint-every``) are generated from the pipeline parameters of the same names
(``cifar10_kfp.params``), with their help text, and map to a ``TrainConfig`` the way the
pipelines' train step does (``cifar10_kfp.params.train_config``).
"""

from __future__ import annotations

import argparse

HELP = (
    "train a model on a prepared dataset (presets seed/fast/cpu; --set key=value overrides any config field)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cifar10_kfp.params import CONFIG_KNOBS
    from cifar10_kfp.train import PRESET_NAMES

    parser.add_argument(
        "--data", required=True, help="prepared dataset: dataset.safetensors path, its dir, or s3:// URI"
    )
    parser.add_argument(
        "--preset", choices=PRESET_NAMES, default="seed", help="starting configuration (default seed)"
    )
    for knob in CONFIG_KNOBS:
        flag = "--" + knob.name.replace("_", "-")
        parser.add_argument(flag, type=knob.kind, default=None, help=knob.description.replace("%", "%%"))
    parser.add_argument("--nproc", type=int, default=1, help="DDP processes in this pod (0 = one per GPU)")
    parser.add_argument(
        "--checkpoint-uri", default="", help="checkpoint prefix (s3:// or local dir); resumes if present"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override any TrainConfig field, e.g. --set label_smoothing=0.1 --set widths=32,64,128",
    )  # fmt: skip
    parser.add_argument("--output-dir", required=True, help="where model/, history.json and metrics.json go")
    from cifar10_kfp_pipelines.commands.common import add_multinode_arguments

    add_multinode_arguments(parser)


def config_from_args(args: argparse.Namespace):
    """The ``TrainConfig`` of the parsed flags: ``--set`` first, then the knob flags given."""
    from cifar10_kfp.params import CONFIG_KNOBS, train_config
    from cifar10_kfp_pipelines.commands.common import parse_key_values

    training = {"preset": args.preset, "extra_hparams": parse_key_values(args.overrides, flag="--set")}
    for knob in CONFIG_KNOBS:
        if getattr(args, knob.name) is not None:
            training[knob.name] = getattr(args, knob.name)
    return train_config(training)


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp.train import train
    from cifar10_kfp_pipelines.commands.common import finish, rendezvous_from_args

    config = config_from_args(args)
    result = train(config, args.data, args.output_dir, checkpoint_uri=args.checkpoint_uri, nproc=args.nproc,
                   rendezvous=rendezvous_from_args(args))  # fmt: skip
    finish(result, args)
    return 0
