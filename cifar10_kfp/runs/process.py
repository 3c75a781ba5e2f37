"""The end of a pipeline task's process.

Each KFP task runs its component in a fresh Python process that exits as soon as the component
returns. Interpreter exit garbage-collects every object still alive; once torch is loaded that
is a few hundred thousand objects, 0.15-0.35 s per task, spent finding no garbage worth the
wait. ``gc.freeze()`` takes them out of the collector's view, so exit only frees what
reference counting frees (Python never promised finalizers of leftover cycles at exit).
"""

from __future__ import annotations

import gc
import os
from typing import Any

# Set to "true" by the command of every compiled lightweight component (kfp.dsl.executor_main).
KFP_TASK_ENV = "_KFP_RUNTIME"


def freeze_heap_before_exit() -> bool:
    """Freeze the heap if this is a KFP task process; a no-op (False) anywhere else.

    Components call it last. A long-lived process that calls a component function directly
    (a test, a notebook) is left alone: garbage frozen there would never be freed.
    """
    if os.environ.get(KFP_TASK_ENV) != "true":
        return False
    gc.freeze()
    return True


def write_metadata_file(artifact: Any) -> None:
    """Write a KFP ``Metrics``/``ClassificationMetrics`` artifact's metadata to its path as JSON.

    KFP keeps these figures in ML Metadata only and uploads nothing for them; the KFP UI's Artifact Info
    tab still previews the artifact's object and answers "No objects found at ..." for a path nothing
    was written to. ``artifact`` is any object with ``path`` and ``metadata`` (kfp's artifact classes).
    """
    import json

    with open(artifact.path, "w", encoding="utf-8") as fh:
        json.dump(artifact.metadata, fh, indent=1, sort_keys=True)
