"""The pipelines this project ships, by short name, and how to build and compile them."""

from __future__ import annotations

from pathlib import Path

from cifar10_kfp_pipelines.policy import ClusterPolicy

PIPELINE_NAMES = {"training": "cifar10-training", "sweep": "cifar10-sweep", "tune": "cifar10-tune"}
COMPILED_DIR = Path(__file__).resolve().parent / "compiled"


def resolve(name: str) -> str:
    """``training``/``sweep``/``tune`` or the full names (``cifar10-training`` ...) -> the short name."""
    for short, full in PIPELINE_NAMES.items():
        if name in (short, full):
            return short
    raise ValueError(f"pipeline {name!r}: use one of {', '.join(PIPELINE_NAMES)}")


def build(name: str, policy: ClusterPolicy | None = None, **build_params):
    """The pipeline (a kfp ``GraphComponent``) with ``policy`` and compile-time settings applied."""
    short = resolve(name)
    if short in ("training", "tune"):
        if build_params:
            raise ValueError(f"the {short} pipeline has no build settings, got {', '.join(build_params)}")
        if short == "tune":
            from cifar10_kfp_pipelines.tune import build_tune_pipeline

            return build_tune_pipeline(policy)
        from cifar10_kfp_pipelines.training import build_training_pipeline

        return build_training_pipeline(policy)
    from cifar10_kfp_pipelines.sweep import build_sweep_pipeline

    return build_sweep_pipeline(policy, **build_params)


def compile_to(name: str, path: str | Path, policy: ClusterPolicy | None = None, **build_params) -> Path:
    """Compile pipeline ``name`` to a YAML file at ``path``."""
    from kfp import compiler

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build(name, policy, **build_params), package_path=str(path))
    return path


def compiled_path(name: str, output_dir: str | Path = COMPILED_DIR) -> Path:
    return Path(output_dir) / f"{PIPELINE_NAMES[resolve(name)]}.yaml"
