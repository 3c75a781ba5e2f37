"""Multi-node training through Kubeflow Trainer v2 (>= 2.2): one ``TrainJob`` per training run.

* ``manifest``: the request, the job's name (<= 40 characters), the node command (elastic with
  ``--nnodes MIN:MAX``), the manifest with its pod settings, the job's state, the Trainer version;
* ``api``: the Kubernetes client, the Trainer version check, create and delete;
* ``watch``: the job's state changes and the Warning events of what it made;
* ``launcher``: ``run_trainjob``, the whole launch: check, submit, watch, time out, cancel on
  SIGTERM, collect the outputs, delete the finished job.
"""

from cifar10_kfp.trainjob.api import (
    TrainerTooOld,
    TrainJobFailed,
    TrainJobTimedOut,
    check_trainer_version,
    current_namespace,
    delete_trainjob,
    launcher_pod,
    load_kubernetes,
    read_trainer_crd,
    submit_trainjob,
)
from cifar10_kfp.trainjob.launcher import DEFAULT_TIMEOUT_H, collect_outputs, request_for_run, run_trainjob
from cifar10_kfp.trainjob.manifest import (
    DEFAULT_RUNTIME,
    GROUP,
    KIND,
    MAX_JOB_NAME,
    MAX_POD_NAME,
    PLURAL,
    VERSION,
    JobState,
    TrainJobRequest,
    build_trainjob,
    config_arguments,
    job_name,
    job_state,
    longest_pod_name,
    node_command,
    too_old_message,
    trainer_version_from_crd,
)
from cifar10_kfp.trainjob.watch import EventReporter, watch_trainjob

__all__ = [
    "DEFAULT_RUNTIME", "GROUP", "KIND", "MAX_JOB_NAME", "MAX_POD_NAME", "PLURAL", "VERSION",
    "EventReporter", "JobState", "TrainJobFailed", "TrainJobRequest", "TrainJobTimedOut", "TrainerTooOld",
    "DEFAULT_TIMEOUT_H", "build_trainjob", "check_trainer_version", "request_for_run", "collect_outputs", "config_arguments", "current_namespace",
    "delete_trainjob", "job_name", "job_state", "launcher_pod", "load_kubernetes", "longest_pod_name",
    "node_command", "read_trainer_crd", "too_old_message", "run_trainjob", "submit_trainjob", "trainer_version_from_crd",
    "watch_trainjob",
]  # fmt: skip
