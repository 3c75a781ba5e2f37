"""The real KFP 2.17.0 UI in a real browser (issue 35): a person uploads, starts, follows and reads runs.

The stack is test_kfp_real_run's (the real backend, Argo, a real node, ML Metadata, the embedded store)
plus the UI (localcluster/kfp_ui.py): upstream's frontend and Node server built from the pinned tree,
and a gRPC-web proxy in front of ML Metadata. Chromium is Debian's, driven by Playwright
(kfp_ui_pages.py), by the labels and names the pages show; nothing here calls the KFP API.

What a person uploads is the committed training pipeline compiled for a small CPU pool, as its user
would (`cifar10-kfp compile --train-cpu 1 --train-memory 3Gi:6Gi`: the node here has 2 cores). The
scenarios share one module's runs, in order: the upload, the run form (a tiny run, a bad value, a
recurring run), then following the tiny run, reading its evaluate step, and comparing it with the
recurring run's first run. Each page is saved under the module's output folder (`shots`), and every
scenario fails on an error the page reported (kfp_ui_pages.UPSTREAM_CONSOLE_NOISE lists the three
upstream ones it ignores).

Upstream's run form shows each parameter's name and type only (components/NewRunParametersV2.tsx
labels a field `{key} - {type}`; the descriptions in the compiled YAML are not drawn): the scenario
checks every parameter is offered, and docs/kfp-ui.md says where the descriptions are.
"""

from __future__ import annotations

import os
import re
import subprocess
import types

import pytest

from localcluster.prerequisites import missing_for_real_node
from tests.cluster.kfp_stack import DATASET, DATASET_URI
from tests.cluster.kfp_ui_pages import DONE_ICONS, FAILED_ICON, Browser
from tests.support.browser import CHROMIUM, SKIP_REASON
from tests.support.cli import command, user_env
from tests.support.paths import ROOT

PIPELINE = "cifar10-training-small"
TINY = {
    "max_train_samples": "1000", "max_test_samples": "500", "epochs": "1", "num_gpus": "0",
    "dataset_uri": DATASET_URI, "min_accuracy": "0",
}  # fmt: skip
#: The steps of the single-node branch, as the DAG names them (pipelines/steps.py, training.py).
DATA_STEPS = ("validate", "download", "preprocess")
TRAIN_STEPS = ("train", "evaluate", "gate", "record-outputs")
GROUPS = ("pipeline-steps", "single-node")
_RUN_TIMEOUT_S = 1500
#: Where the screenshots go besides the test's tmp dir: `CIFAR10_KFP_UI_SHOTS=docs/images/kfp-ui make
#: test-cluster` retakes docs/kfp-ui.md's pictures.
SHOTS_ENV = "CIFAR10_KFP_UI_SHOTS"

pytestmark = [
    pytest.mark.skipif(missing_for_real_node() is not None, reason=str(missing_for_real_node())),
    pytest.mark.skipif(not DATASET.is_file(), reason="the CIFAR-10 archive of ../shared is missing"),
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
]


@pytest.fixture(scope="module")
def ui(control_plane, kfp_stack, tmp_path_factory):
    """The session's stack with its UI; yields a namespace the scenarios fill in (run ids, the package)."""
    pytest.importorskip("playwright", reason="the dev extra installs playwright")
    from localcluster import kfp_ui_build
    from localcluster.kfp_ui import KfpUi
    from tests.cluster import conftest

    work = tmp_path_factory.mktemp("kfp-ui")
    stack = kfp_stack
    with KfpUi(control_plane, stack.backend, stack.pods.mlmd.address, stack.store) as server:
        figures = kfp_ui_build.build_figures() or {}
        conftest._TIMINGS["KFP UI first build (cached)"] = figures.get("build_seconds", 0.0)
        shared = types.SimpleNamespace(ui=server, shots=work / "shots", runs={})
        shared.package = _compile_small(work / "compiled")
        try:
            yield shared
        finally:
            # The recurring run made from the form must not fire into the tests after this module.
            control_plane.kubectl("delete", "scheduledworkflows", "--all", "-n", "kubeflow", "--wait=false")
            if os.environ.get(SHOTS_ENV):
                _copy_shots(shared.shots, ROOT / os.environ[SHOTS_ENV])


def _compile_small(out) -> object:
    done = subprocess.run(
        command("compile", "--pipeline", "training", "--output-dir", str(out), "--train-cpu", "1",
                "--train-memory", "3Gi:6Gi"),
        cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "cifar10-training.yaml"


def _copy_shots(shots, target) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for png in shots.glob("*.png"):
        (target / png.name).write_bytes(png.read_bytes())


def _browser(ui) -> Browser:
    return Browser(ui.ui.url, ui.shots)


def _no_page_errors(browser: Browser) -> None:
    assert not browser.errors, "the page reported errors:\n" + "\n".join(browser.errors)


@pytest.mark.timeout(3000)  # a cold machine builds the UI and the component image first
def test_ui_uploads_the_pipeline_and_draws_its_dag(ui):
    with _browser(ui) as b:
        b.upload_pipeline(ui.package, PIPELINE)
        b.page.get_by_title("pipeline-steps", exact=True).wait_for()
        b.screenshot("pipeline")
        assert b.page.get_by_text("Version: 2.17.0").count() == 1, "the side nav names the KFP release"
        _no_page_errors(b)


def test_ui_run_form_offers_every_parameter_and_starts_a_tiny_run(ui):
    import yaml

    spec = next(yaml.safe_load_all(ui.package.read_text()))
    expected = set(spec["root"]["inputDefinitions"]["parameters"])
    with _browser(ui) as b:
        b.open_run_form(PIPELINE)
        offered = {label.split(" - ")[0] for label in b.parameter_labels()}
        assert offered == expected, f"missing {expected - offered}, unknown {offered - expected}"
        b.fill_run_form("ui-tiny", TINY)
        b.screenshot("run-form", full_page=True)
        ui.runs["tiny"] = b.start()
        _no_page_errors(b)


def test_ui_recurring_run_from_the_form(ui):
    with _browser(ui) as b:
        b.open_run_form(PIPELINE)
        b.fill_run_form("ui-every-minute", TINY)
        b.make_recurring("ui-every-minute", every_minutes=1, max_concurrent=1)
        b.screenshot("recurring-form", full_page=True)
        b.start()
        b.open("/recurringruns")
        b.page.get_by_role("link", name="ui-every-minute").click()
        b.page.get_by_text("Run trigger").wait_for()
        b.screenshot("recurring-run")
        _no_page_errors(b)


@pytest.mark.timeout(2400)
def test_ui_bad_value_typed_into_the_form_fails_validate_with_its_message(ui):
    with _browser(ui) as b:
        b.open_run_form(PIPELINE)
        b.fill_run_form("ui-bad-epochs", {**TINY, "epochs": "-3"})
        run_id = b.start()
        status = b.poll("the bad run's failure", lambda: _finished(b, run_id), _RUN_TIMEOUT_S)
        assert status.startswith("Resource failed"), status
        b.open_steps(run_id, GROUPS[:1])
        assert FAILED_ICON in b.step_icons(["validate"])["validate"]
        b.open_node("validate", "Logs")
        b.wait_for_text(re.compile(r"epochs=-3"), 60)
        b.screenshot("bad-value")
        _no_page_errors(b)


def _finished(b: Browser, run_id: str) -> str | None:
    status = b.run_status(run_id)
    return None if status in ("Running", "Pending execution", "Unknown status") else status


@pytest.mark.timeout(2400)
def test_ui_follows_the_tiny_run_its_steps_turn_green_and_train_logs_epochs(ui):
    run_id = ui.runs["tiny"]
    with _browser(ui) as b:
        status = b.poll("the tiny run's end", lambda: _finished(b, run_id), _RUN_TIMEOUT_S)
        assert status == "Executed successfully", status
        b.open_steps(run_id, GROUPS[:1])
        icons = b.step_icons(list(DATA_STEPS))
        assert all(set(DONE_ICONS) & set(i) for i in icons.values()), icons
        b.expand(GROUPS[1])
        icons = b.step_icons(list(TRAIN_STEPS))
        assert all(set(DONE_ICONS) & set(i) for i in icons.values()), icons
        b.screenshot("run-dag")
        b.open_node("train", "Logs")
        b.wait_for_text(re.compile(r"1/1 +\d+\.\d{4}"), 60)  # the fixed-column epoch line, epoch 1 of 1
        b.screenshot("train-logs")
        _no_page_errors(b)


def test_ui_evaluate_step_shows_metrics_confusion_matrix_report_and_markdown(ui):
    with _browser(ui) as b:
        b.open_steps(ui.runs["tiny"], GROUPS)
        b.open_node("classification_metrics", "Visualization")
        b.wait_for_text("Confusion Matrix: classification_metrics", 60)
        for name in ("airplane", "truck"):
            assert b.page.get_by_text(name, exact=True).count() >= 1
        b.screenshot("confusion-matrix")
        b.open_node("summary", "Visualization")
        b.wait_for_text("Evaluation summary", 60)
        b.screenshot("markdown")
        b.open_node("report", "Visualization")
        report = b.page.frame_locator("iframe").first
        # The report is one self-contained file of a few MB (its pictures inline), read through the UI server.
        report.get_by_text("Model evaluation report").wait_for(timeout=120_000)
        assert report.locator("img").count() >= 2, "the report's curves and attribution maps"
        b.screenshot("report")
        _scalar_metrics(b)
        _no_page_errors(b)


def _scalar_metrics(b: Browser) -> None:
    """Of the two `metrics` nodes (train's and evaluate's), evaluate's lists the test accuracy."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for index in range(b.page.get_by_title("metrics", exact=True).count()):
        b.open_node("metrics", "Visualization", index)
        try:  # the panel reads the artifact from ML Metadata after it opens: wait, don't just look
            b.wait_for_text("accuracy_plain", 45)
        except PlaywrightTimeout:
            continue
        b.screenshot("metrics")
        return
    raise AssertionError("no metrics node shows evaluate's scalar metrics (accuracy_plain)")


@pytest.mark.timeout(2400)
def test_ui_recurring_runs_first_run_succeeds_and_compares_with_the_tiny_run(ui):
    with _browser(ui) as b:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        def first_fired_run():
            # KFP names a recurring run's runs <config name><suffix>-<firing index>-<n> (scheduledworkflow).
            b.open("/runs")
            first = b.page.get_by_role("link", name=re.compile(r"^ui-every-minute\w*-1-\d+$")).first
            try:
                first.wait_for(timeout=10_000)
            except PlaywrightTimeout:
                return None
            return first.get_attribute("href")

        href = b.poll("the recurring run's first run", first_fired_run, 300)
        fired = href.rsplit("/", 1)[-1]
        status = b.poll("the recurring run's first run", lambda: _finished(b, fired), _RUN_TIMEOUT_S)
        assert status == "Executed successfully", status
        b.open(f"/compare?runlist={ui.runs['tiny']},{fired}")
        b.page.get_by_role("button", name="Scalar Metrics").click()
        b.wait_for_text("accuracy_plain", 60)
        assert b.page.get_by_text("ui-tiny").count() >= 1
        b.screenshot("compare")
        _no_page_errors(b)
