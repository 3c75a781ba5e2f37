"""The stages' public APIs are fully typed: every name a stage package exports has annotated signatures.

`make typecheck` (mypy, run by .ci/run) checks the bodies against the annotations; this test checks that
the annotations are there, so that no public function falls back to an unchecked ``Any``.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

STAGES = ["tracking", "storage", "data", "train", "evaluate", "publish", "runs", "params", "tune", "trainjob"]


def _unannotated(function, where: str) -> list[str]:
    missing = []
    signature = inspect.signature(function)
    for parameter in signature.parameters.values():
        if parameter.name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty:
            missing.append(f"{where}: parameter {parameter.name!r}")
    if signature.return_annotation is inspect.Signature.empty and function.__name__ != "__init__":
        missing.append(f"{where}: return type")
    return missing


def _public_functions(obj, where: str):
    """``obj`` itself if it is a function; a class's own public methods, properties and ``__init__``."""
    if inspect.isfunction(obj):
        yield where, obj
    elif inspect.isclass(obj):
        for attr, member in vars(obj).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            member = member.fget if isinstance(member, property) else member
            member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            # a dataclass's generated __init__ is typed from its fields
            if inspect.isfunction(member) and member.__module__ == obj.__module__:
                yield f"{where}.{attr}", member


@pytest.mark.parametrize("stage", STAGES)
def test_every_exported_function_and_method_is_annotated(stage):
    package = importlib.import_module(f"cifar10_kfp.{stage}")
    assert package.__all__, f"cifar10_kfp.{stage} exports nothing"
    missing = []
    for name in package.__all__:
        for where, function in _public_functions(getattr(package, name), f"cifar10_kfp.{stage}.{name}"):
            missing += _unannotated(function, where)
    assert not missing, "unannotated public API:\n" + "\n".join(missing)
