"""The pipeline parameters: one table of names, types, defaults, descriptions and rules.

Modules: ``table`` (the rows; the pipelines' signatures and docstrings and the mapping to a
``TrainConfig`` follow from them), ``checks`` (one small function per value rule), ``validation``
(a pipeline's values as a whole: each against its row, then the combinations), ``space`` (a
study's search space: parsing and validation).

This stage sits above the stages whose rules it asks (``train``'s presets and models,
``publish``'s model-name rule). The API below loads on first use; none of it imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.params.space import Dimension, parse_search_space, space_json
    from cifar10_kfp.params.table import (
        BUILD_PARAMS,
        CONFIG_KNOBS,
        SWEEP_PARAMS,
        TRAINING_KEYS,
        TRAINING_PARAMS,
        TUNE_PARAMS,
        Param,
        checkpoint_prefix,
        coerce_params,
        defaults,
        docstring,
        pipeline_params,
        signature,
        train_config,
        training_settings,
    )
    from cifar10_kfp.params.validation import (
        validate_build_params,
        validate_pipeline_params,
        validated_outputs,
    )

__all__ = [
    "BUILD_PARAMS", "CONFIG_KNOBS", "SWEEP_PARAMS", "TRAINING_KEYS", "TRAINING_PARAMS", "TUNE_PARAMS",
    "Dimension", "Param", "checkpoint_prefix", "coerce_params", "defaults", "docstring", "parse_search_space",
    "pipeline_params", "signature", "space_json", "train_config", "training_settings", "validate_build_params",
    "validate_pipeline_params", "validated_outputs",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
