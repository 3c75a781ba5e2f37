"""cifar10_kfp: the training library behind the cifar10-kfp pipelines.

Plain Python and PyTorch. It never imports kfp, so every step also runs from the
command line or a notebook without Kubeflow.

The folders are the stages. A stage imports only from the stages before it in this order
(``tests/test_stage_order.py`` checks every import, those inside functions included):

=============  ===========================================================================
``tracking``   live metrics to an MLflow run and a TrainJob's status, when the environment names them
``storage``    one API over S3-compatible object stores and local paths; the embedded SeaweedFS
``data``       download (verified, content-addressed), safe archives, the prepared-dataset file
``train``      config, models, the training engine, checkpoints, torchrun, training curves
``evaluate``   a model on the test split: metrics, attribution maps, the HTML report
``publish``    the champion/challenger gate, the model registry, serving bundles, model cards
``runs``       what a pipeline run records about itself, its summary, a task's process end
``params``     the pipeline parameters: one table, their rules, validation, the search space
``tune``       hyperparameter tuning: one Optuna study in one process
``trainjob``   multi-node training through a Kubeflow Trainer ``TrainJob``
=============  ===========================================================================

Below them all, the two modules at the top (``env_settings``: numeric environment settings;
``progress``: progress lines of long work) import no stage. ``components/`` and ``pipelines/``
import a stage's public API (``from cifar10_kfp.train import train``), never its inner modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

STAGES = ("tracking", "storage", "data", "train", "evaluate", "publish", "runs", "params", "tune", "trainjob")


def lazy_exports(package: str, init_file: str):
    """``__getattr__`` and ``__dir__`` for a stage package that loads its public API on first use.

    The package's ``__init__`` names its API in an ``if TYPE_CHECKING:`` block of imports (what
    type checkers and readers see); at run time each name is imported from its module when first
    asked for. So importing a light module of a stage (``cifar10_kfp.train.config``) or a stage
    whose API needs torch does not import torch until something from it is used.
    """
    import ast
    import importlib
    import sys
    from pathlib import Path

    where: dict[str, str] = {}
    for node in ast.parse(Path(init_file).read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    where.update({(a.asname or a.name): imp.module for a in imp.names})

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
