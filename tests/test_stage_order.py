"""The library's folders are its stages, in one order (``cifar10_kfp.STAGES``).

Every import counts, those inside function bodies too: a stage may import from itself, from the
stages before it and from the modules at the top of ``cifar10_kfp/``; the top modules import no
stage. ``components/`` and ``pipelines/`` import a stage's public API (its ``__all__``), never an
inner module. The packages' lazy exports must all resolve.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import cifar10_kfp

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "cifar10_kfp"
STAGES = cifar10_kfp.STAGES
TOP_MODULES = {"__init__", "env_settings", "progress"}


def imported_modules(path: Path, module: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of every import of cifar10_kfp in ``path``, anywhere in it."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, alias.name, []))
            continue
        else:
            continue
        found.append((node.lineno, target, names))
    return [(line, t, n) for line, t, n in found if t == "cifar10_kfp" or t.startswith("cifar10_kfp.")]


def stage_of(target: str, names: list[str]) -> list[str | None]:
    """The stage(s) an import reaches: None for a top module; ``from cifar10_kfp import x`` per name."""
    parts = target.split(".")
    if len(parts) == 1:
        return [n if n in STAGES else None for n in names]
    return [parts[1] if parts[1] in STAGES else None]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts)


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(LIB.rglob("*.py")):
        module = module_name(path)
        parts = module.split(".")
        own = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else None
        rank = STAGES.index(own) if own else -1
        for line, target, names in imported_modules(path, module):
            for stage in stage_of(target, names):
                if stage is not None and STAGES.index(stage) > rank:
                    where = f"{path.relative_to(ROOT)}:{line}"
                    bad.append(
                        f"{where}: stage {own or 'top'} imports {target} (stage {stage}, later in the order)"
                    )
    return bad


def public_api(stage: str) -> set[str]:
    return set(importlib.import_module(f"cifar10_kfp.{stage}").__all__)


def inner_imports(folder: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if "compiled" in path.parts:
            continue
        for line, target, names in imported_modules(path, module_name(path)):
            parts = target.split(".")
            where = f"{path.relative_to(ROOT)}:{line}"
            if len(parts) > 2 and parts[1] in STAGES:
                bad.append(f"{where}: imports the inner module {target}; use cifar10_kfp.{parts[1]}'s API")
            elif len(parts) == 2 and parts[1] in STAGES:
                missing = sorted(set(names) - public_api(parts[1]))
                if missing:
                    bad.append(f"{where}: {missing} are not in cifar10_kfp.{parts[1]}.__all__")
    return bad


def test_the_library_has_no_more_than_three_top_modules():
    top = {p.stem for p in LIB.glob("*.py")}
    assert top == TOP_MODULES, (
        f"modules at the top of cifar10_kfp/: {sorted(top)}; a stage's module goes in its package"
    )
    packages = {p.name for p in LIB.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(STAGES), f"packages {sorted(packages)} != the stages {STAGES}"


def test_a_stage_imports_only_from_stages_before_it():
    assert upward_imports() == []


@pytest.mark.parametrize("folder", ["components", "pipelines"])
def test_components_and_pipelines_import_only_the_stages_public_api(folder):
    assert inner_imports(folder) == []


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_documents_itself_and_its_api_resolves(stage):
    package = importlib.import_module(f"cifar10_kfp.{stage}")
    assert package.__doc__ and len(package.__doc__.split()) > 10, f"cifar10_kfp.{stage} needs a docstring"
    assert len(package.__all__) == len(set(package.__all__)), f"cifar10_kfp.{stage}.__all__ repeats a name"
    for name in package.__all__:
        assert getattr(package, name) is not None, f"cifar10_kfp.{stage}.{name}"
        assert name in dir(package)


def test_the_light_stages_do_not_import_torch():
    # validate, the CLI's argument parsing and the pipelines' compilation import these: keep them fast
    code = (
        "import sys, cifar10_kfp.params, cifar10_kfp.params.validation, cifar10_kfp.storage, cifar10_kfp.data, "
        "cifar10_kfp.runs, cifar10_kfp.train, cifar10_kfp.train.config, cifar10_kfp.evaluate, cifar10_kfp.publish, "
        "cifar10_kfp.tune, cifar10_kfp.trainjob; from cifar10_kfp.params import validated_outputs, TRAINING_KEYS; "
        "print(sorted(m for m in ('torch', 'numpy', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_the_order_check_finds_an_upward_import(tmp_path, monkeypatch):
    # the check itself: a data module that asks train for something is refused, with its place
    fake = tmp_path / "cifar10_kfp" / "data" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from cifar10_kfp.train.config import TrainConfig\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIB", tmp_path / "cifar10_kfp")
    assert upward_imports() == [
        "cifar10_kfp/data/bad.py:2: stage data imports cifar10_kfp.train.config (stage train, later in the order)"
    ]
