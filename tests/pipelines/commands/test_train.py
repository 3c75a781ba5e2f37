"""``cifar10-kfp train``: flags generated from the pipeline parameters, the same mapping as the pipelines,
and a seconds-long CPU run."""

from __future__ import annotations

import argparse
import json

from cifar10_kfp.params.table import CONFIG_KNOBS, train_config
from cifar10_kfp_pipelines.cli import main as cli_main
from cifar10_kfp_pipelines.commands.train import add_arguments, config_from_args


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--data", "d", "--output-dir", "o", *argv])


def test_knob_flags_are_the_pipeline_parameters_with_their_help():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for knob in CONFIG_KNOBS:
        assert "--" + knob.name.replace("_", "-") in actions[knob.name].option_strings
        assert actions[knob.name].help.replace("%%", "%") == knob.description
    assert "GLOBAL" in actions["batch_size"].help


def test_flags_map_to_the_config_as_the_pipeline_settings_do():
    args = _parse("--preset", "cpu", "--epochs", "2", "--architecture", "simple_cnn", "--set", "widths=",
                  "--set", "label_smoothing=0.05", "--set", "seed=9", "--lr", "0.2")  # fmt: skip
    config = config_from_args(args)
    assert (config.epochs, config.architecture, config.label_smoothing, config.lr, config.seed) == (
        2, "simple_cnn", 0.05, 0.2, 9,
    )  # fmt: skip
    pipeline_settings = {"preset": "cpu", "architecture": "simple_cnn", "epochs": 2, "batch_size": 0, "lr": 0.2,
                         "seed": 9, "checkpoint_every": 0, "extra_hparams": '{"label_smoothing": 0.05, "widths": ""}'}  # fmt: skip
    assert train_config(pipeline_settings).to_dict() == config.to_dict()
    assert config_from_args(_parse("--seed", "7", "--set", "seed=9")).seed == 7  # the flag wins over --set
    assert config_from_args(_parse()).to_dict() == train_config({"preset": "seed"}).to_dict()


def test_cli_train_seconds_long_cpu_mode(tiny_dataset_path, tmp_path, capsys):
    code = cli_main(
        ["train", "--data", str(tiny_dataset_path), "--preset", "seed", "--epochs", "1", "--batch-size", "32",
         "--set", "label_smoothing=0.1", "--output-dir", str(tmp_path / "o"), "--checkpoint-uri", str(tmp_path / "ck")]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["steps"] == 256 // 32
    stdout = capsys.readouterr().out
    assert "1/1" in stdout  # the per-epoch progress line
    assert json.loads(stdout[stdout.index("\n{") + 1 :]) == metrics  # metrics.json echoed for scripts
    assert (tmp_path / "ck" / "latest.json").is_file()


def test_cli_bad_set_options_are_clear_errors(tiny_dataset_path, tmp_path, capsys):
    base = ["train", "--data", str(tiny_dataset_path), "--output-dir", str(tmp_path / "o")]
    assert cli_main([*base, "--set", "lr_warmup=3"]) == 2
    assert "unknown training config key(s) ['lr_warmup']" in capsys.readouterr().err
    assert cli_main([*base, "--set", "lr"]) == 2
    assert "--set 'lr': expected KEY=VALUE" in capsys.readouterr().err
