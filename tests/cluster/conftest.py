"""Session fixtures of the real control-plane suite (`make test-cluster`) and its closing table.

`control_plane`: one real control plane for the session (localcluster/controlplane.py).
`trainer_stack`: the real JobSet + Trainer managers installed on it, parametrised over the two
pinned pairs ("2.2", "2.3"); pytest runs every test of one stack before installing the next, and
the stack's CRDs, webhooks and runtime are removed in between. CIFAR10_KFP_CLUSTER_STACKS=2.3
limits a run to one stack. The table printed at the end names each component with its version
and each scenario with its result; CLUSTER_TABLE_JSON=path also writes it as JSON.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from localcluster import gobuild, versions
from localcluster.controlplane import ControlPlane
from localcluster.kubeflow import install_trainer
from tests.cluster.stages import STAGES, stage_verdict

# Every pinned stack is a parameter; CIFAR10_KFP_CLUSTER_STACKS=2.3 skips the others' tests, and says so
# (a skip, which CI counts as a failure: CI runs both).
_STACKS = list(versions.TRAINER_STACKS)
_SELECTED_STACKS = [
    s for s in os.environ.get("CIFAR10_KFP_CLUSTER_STACKS", ",".join(versions.TRAINER_STACKS)).split(",") if s
]
_RESULTS: list[tuple[str, str, float]] = []
_TIMINGS: dict[str, float] = {}
_SESSION_STARTED: list[float] = []  # monotonic clock at the session's start (pytest_sessionstart)


def pytest_sessionstart(session):
    _SESSION_STARTED.append(time.monotonic())


def _total_line() -> str:
    """The whole session, set-ups and tear-downs included, beside the scenarios' own calls."""
    total = time.monotonic() - _SESSION_STARTED[0] if _SESSION_STARTED else 0.0
    calls = sum(duration for _, _, duration in _RESULTS)
    return f"total: {len(_RESULTS)} results in {total // 60:.0f} min {total % 60:02.0f} s (their own calls {calls:.0f} s)"


@pytest.fixture(scope="session")
def control_plane():
    with ControlPlane() as cp:
        _TIMINGS["control plane start"] = cp.started_in_s
        yield cp


@pytest.fixture(scope="session", params=_STACKS)
def trainer_stack(request, control_plane):
    if request.param not in _SELECTED_STACKS:
        pytest.skip(
            f"Trainer stack {request.param} deselected: CIFAR10_KFP_CLUSTER_STACKS={','.join(_SELECTED_STACKS)}"
        )
    stack = install_trainer(control_plane, request.param)
    _TIMINGS[f"trainer stack {request.param} start"] = stack.started_in_s
    try:
        yield stack
    finally:
        stack.stop()


#: The modules on the session's `kfp_stack` (a real node): run last, so that no other real node (test_real_node,
#: test_real_trainjob, test_clean_stop's `make cluster-full`) is up beside it.
KFP_STACK_MODULES = ("test_kfp_real_run.py", "test_kfp_ui.py")


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by Trainer stack
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name in KFP_STACK_MODULES)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def kfp_stack(control_plane, tmp_path_factory):
    """The KFP backend, its object store and a real node for runs on real pods (kfp_stack.py)."""
    from tests.cluster.kfp_stack import kfp_stack_on_node

    with kfp_stack_on_node(control_plane, tmp_path_factory.mktemp("kfp-real")) as stack:
        yield stack


@pytest.fixture
def record_timing():
    """`record_timing(what, seconds)`: a line of the closing table's timings (a scenario's own start or stop)."""
    return _TIMINGS.__setitem__


@pytest.fixture
def cluster_namespace(control_plane):
    """A fresh namespace whose default service account exists; deleted afterwards."""
    name = control_plane.create_namespace(f"t-{uuid.uuid4().hex[:8]}")
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when != "call" and report.outcome != "passed"):
        outcome = report.outcome if report.when == "call" else f"{report.outcome} in {report.when}"
        if getattr(report, "wasxfail", None):
            outcome = f"xfailed: {report.wasxfail}"
        _RESULTS.append((report.nodeid.split("::", 1)[-1], outcome, report.duration))


def _stage_lines() -> list[str]:
    """Issue 24's stages, each with the result of the scenarios that show it (stages.py)."""
    lines = ["", f"{'stage':48} result", f"{'-' * 48} ------"]
    for stage, scenarios in STAGES:
        lines.append(f"{stage:48} {stage_verdict(scenarios, _RESULTS)}")
    return lines


def _table_lines() -> list[str]:
    # build.json keeps how long the build that made the cached binary took: the cold first build,
    # or a relink when the Go build cache was already warm.
    lines = [f"{'component':30} {'version':10} built in", f"{'-' * 30} {'-' * 10} --------"]
    for name, version in versions.components():
        seconds = gobuild.build_seconds(name, version)
        lines.append(f"{name:30} {version:10} {'not built' if seconds is None else f'{seconds:.0f} s'}")
    lines.append("")
    for what, seconds in _TIMINGS.items():
        lines.append(f"{what:41} {seconds:.0f} s")
    width = max(len(name) for name, _, _ in _RESULTS)
    lines += ["", f"{'scenario':{width}} result", f"{'-' * width} ------"]
    lines += [f"{name:{width}} {outcome} ({duration:.1f} s)" for name, outcome, duration in _RESULTS]
    return lines + _stage_lines()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _RESULTS:
        return
    terminalreporter.section("real control plane: components and scenarios")
    for line in [*_table_lines(), "", _total_line()]:
        terminalreporter.write_line(line)
    target = os.environ.get("CLUSTER_TABLE_JSON")
    if target:
        rows = {
            "components": [
                {"name": n, "version": v, "first_build_s": gobuild.build_seconds(n, v)}
                for n, v in versions.components()
            ],
            "timings_s": _TIMINGS,
            "scenarios": [{"name": n, "result": o, "seconds": round(d, 2)} for n, o, d in _RESULTS],
        }
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(rows, indent=2))
