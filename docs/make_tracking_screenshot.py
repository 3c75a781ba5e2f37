"""Take docs/mlflow-curves.png: the MLflow UI's charts of a real training run, as a browser shows them.

    .venv/bin/python docs/make_tracking_screenshot.py          # about 5 minutes on 2 cores

It starts a real ``mlflow server`` (tests/support/mlflow_server.py) on 127.0.0.1, prepares a stratified
subset of the real CIFAR-10 archive (``../shared/datasets/cifar10-jpeg.tar.gz``, or ``--source``), trains on
it with ``cifar10-kfp train`` and ``MLFLOW_TRACKING_URI`` set, exactly as a user does, then opens the run's
"Model metrics" page in headless Chromium (tests/support/browser.py) and saves a screenshot once the
charts have drawn. Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import Chromium  # noqa: E402
from tests.support.mlflow_server import MlflowServer  # noqa: E402
from tests.support.paths import REAL_ARCHIVE  # noqa: E402

CLI = [sys.executable, "-m", "cifar10_kfp_pipelines.cli"]
CHARTS_DRAWN = "document.querySelectorAll('svg .main-svg, canvas').length"
# The UI opens in its GenAI view with an assistant panel; the picture is of the model-training view's charts.
TIDY = """(() => {
  const buttons = Array.from(document.querySelectorAll('button, [role=radio], label'));
  const training = buttons.find(b => b.textContent.trim() === 'Model training');
  if (training) training.click();
  const close = Array.from(document.querySelectorAll('button[aria-label]'))
    .filter(b => /close/i.test(b.getAttribute('aria-label')));
  close.forEach(b => b.click());
  return close.length;
})()"""


def train_tracked(server: MlflowServer, work: Path, source: Path, epochs: int) -> str:
    """Prepare the subset, train it with tracking on; the MLflow run's id."""
    data = work / "dataset.safetensors"
    subprocess.run([*CLI, "data", "--source", str(source), "--max-train-samples", "3000", "--max-test-samples",
                    "500", "--val-fraction", "0.1", "--no-cache", "--output", str(data)], check=True)  # fmt: skip
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "cifar10-kfp"}
    subprocess.run([*CLI, "train", "--data", str(data), "--preset", "cpu", "--epochs", str(epochs),
                    "--output-dir", str(work / "out")], check=True, env=env)  # fmt: skip
    client = server.client()
    experiment = client.get_experiment_by_name("cifar10-kfp")
    (run,) = client.search_runs([experiment.experiment_id], "attributes.run_name = 'train'")
    return f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}/model-metrics"


def screenshot(url: str, profile: Path, output: Path, wait_s: float = 60.0) -> None:
    """Open ``url`` and save a PNG of the page once its charts are drawn (and a moment to settle)."""
    with Chromium(profile) as browser:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        browser.send("Page.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": 1150, "deviceScaleFactor": 1, "mobile": False}, session)  # fmt: skip
        browser.send("Page.navigate", {"url": url}, session)
        browser.wait_for("Page.loadEventFired", session)
        deadline = time.monotonic() + wait_s
        while browser.evaluate(CHARTS_DRAWN, session) < 4 and time.monotonic() < deadline:
            time.sleep(1)  # the UI is a single-page app: its charts come after the load event
        browser.evaluate(TIDY, session)
        time.sleep(3)
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session)
        output.write_bytes(base64.b64decode(shot["data"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=REAL_ARCHIVE, help="the CIFAR-10 archive")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "mlflow-curves.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracking-shot-") as tmp:
        work = Path(tmp)
        server = MlflowServer(work / "mlflow").start()
        try:
            url = train_tracked(server, work, args.source, args.epochs)
            screenshot(url, work / "chromium", args.output)
        finally:
            server.stop()
    print(f"wrote {args.output} ({url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
