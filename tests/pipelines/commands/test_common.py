"""The flags and parsing the commands share (pipelines/commands/common.py); no command imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cifar10_kfp_pipelines.cli import main
from cifar10_kfp_pipelines.commands.common import parse_key_values, warn_if_unpublished_image
from tests.support.paths import ROOT


def test_parse_key_values_keeps_everything_after_the_first_equals_sign():
    assert parse_key_values(["a=1", " b =x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(ValueError, match="--param 'epochs': expected KEY=VALUE"):
        parse_key_values(["epochs"])
    with pytest.raises(ValueError, match="--set '=3': expected KEY=VALUE"):
        parse_key_values(["=3"], flag="--set")


def test_commands_do_not_import_each_other():
    commands = ROOT / "pipelines" / "commands"
    names = {p.stem for p in commands.glob("*.py")} - {"__init__", "common"}
    for path in commands.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "cifar10_kfp_pipelines.commands"
            ):
                imported = {(node.module or "").rpartition(".")[2]} | {a.name for a in node.names}
                assert not imported & names, f"{path.name} imports command module(s) {imported & names}"


def test_the_unpublished_default_image_is_warned_about_loudly(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    assert main(["compile", "--output-dir", str(tmp_path), "--pipeline", "training"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: the steps use the default image ghcr.io/cifar10-kfp/cifar10-kfp:" in err
    assert "NOT published" in err and "--image" in err
    assert main(["compile", "--output-dir", str(tmp_path), "--pipeline", "training",
                 "--image", "registry.example.com/ml/cifar10-kfp:1"]) == 0  # fmt: skip
    assert "WARNING" not in capsys.readouterr().err
    assert not warn_if_unpublished_image("registry.example.com/ml/cifar10-kfp:0.1.0")
    assert Path(tmp_path / "cifar10-training.yaml").is_file()
