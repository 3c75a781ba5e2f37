"""Run records: what a pipeline run records about itself in the object store, and its summary.

Modules: ``records`` (each task's outputs and failures under the run's id, read back by
``cifar10-kfp runs``), ``summary`` (the run's verdict, decided from what it recorded, with KFP's
reported state used only where it is trustworthy), ``process`` (the end of a task's process).

The API below loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.runs.process import freeze_heap_before_exit, write_metadata_file
    from cifar10_kfp.runs.records import (
        RUN_ID_ENV,
        TASK_ENV,
        RunRecords,
        read_summary,
        recent_summaries,
        record_gate_decision,
        record_run_outputs,
        report_failures,
        require_endpoint,
        sweep_outputs,
    )
    from cifar10_kfp.runs.summary import (
        ReportedStatus,
        recorded_cause,
        unpublished_reason,
        verdict_line,
        write_summary,
    )

__all__ = [
    "RUN_ID_ENV", "TASK_ENV", "ReportedStatus", "RunRecords", "freeze_heap_before_exit", "read_summary",
    "recent_summaries", "record_gate_decision", "record_run_outputs", "recorded_cause", "report_failures",
    "require_endpoint", "sweep_outputs", "unpublished_reason", "verdict_line", "write_metadata_file", "write_summary",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
