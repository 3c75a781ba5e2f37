"""Part 8: with recognisable test credentials in the environment, the secret appears nowhere.

The suite's store runs with access key ``RELTESTAK<random>`` and a secret ``RELTESTSECRET<random>``
made fresh each session; every product process in the suite gets them in its environment.
This module scans the compiled pipeline YAML (the committed files and a fresh compile made with
the credentials set) and an executed copy of the experiments notebook. The local-run logs,
artifact metadata, run summaries and stored objects are scanned by the concurrent-runs test,
and every training log by the fault-injection tests. The scanner itself is checked first.
"""

from __future__ import annotations

import base64
import os

import nbformat
import pytest

from tests.reliability.harness import FIGURES, ROOT, FakeCredentials, run_cli, scan_for_secret
from tests.support.datagen import make_official_archive

pytestmark = pytest.mark.reliability


def test_the_scanner_finds_plain_and_base64_leaks():
    creds = FakeCredentials("RELTESTAKSELFTEST", "RELTESTSECRETselftest0123456789abcdef")
    saved = dict(FIGURES.secret_surfaces)
    try:
        secret = creds.secret_key.encode()
        leaks = [
            b"MINIO_SECRET_KEY=" + secret + b"\n",
            b"data: " + base64.b64encode(secret),  # a Kubernetes Secret manifest
            base64.b64encode(b"user:" + secret),  # inside a longer encoded value (3 alignments)
            base64.b64encode(b"ab:" + secret),
            base64.b64encode(b"a:" + secret),
        ]
        for leak in leaks:
            assert scan_for_secret(creds, "scanner self-test", [leak]), leak
        assert not scan_for_secret(creds, "scanner self-test", [b"RELTESTSECRETselftest0123456789abcdeX"])
    finally:
        FIGURES.secret_surfaces.clear()
        FIGURES.secret_surfaces.update(saved)


def test_compiled_pipeline_yaml_holds_no_secret(rel_env, rel_creds, tmp_path):
    out = tmp_path / "compiled"
    code, output = run_cli(
        ["compile", "--output-dir", str(out)], env=rel_env, log_path=tmp_path / "compile.log"
    )
    assert code == 0, output[-3000:]
    fresh = sorted(out.glob("*.yaml"))
    committed = sorted((ROOT / "pipelines" / "compiled").glob("*.yaml"))
    assert fresh and committed
    hits = scan_for_secret(
        rel_creds, "compiled pipeline YAML", [*fresh, *committed, tmp_path / "compile.log"]
    )
    assert not hits, hits
    # The credentials reach the steps by reference to the cluster Secret, never by value.
    text = "\n".join(p.read_text() for p in fresh)
    assert rel_creds.access_key not in text
    assert "mlpipeline-minio-artifact" in text


def _parameters_cell_index(nb) -> int:
    return next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_executed_notebook_outputs_hold_no_secret(rel_env, rel_store, rel_creds, tmp_path, monkeypatch):
    """The notebook run locally against the suite's store, credentials in its environment (never in it)."""
    from nbclient import NotebookClient

    archive = make_official_archive(tmp_path / "cifar-10-python.tar.gz", n_per_batch=30)
    for key, value in rel_env.items():
        if key.startswith(("MINIO_", "CIFAR10_KFP_")):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("KFP_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    values = {
        "DATASET_URI": str(archive),
        "PRESET": "seed",
        "ARCHITECTURE": "simple_cnn",
        "EPOCHS": 1,
        "MAX_TRAIN_SAMPLES": 0,
        "MAX_TEST_SAMPLES": 0,
        "RUNS": [{"lr": 0.01, "seed": 0}],
        "MIN_ACCURACY": 0.0,
        "MODEL_NAME": "rel-notebook",
        "N_EXAMPLES": 4,
        "KFP_HOST": "",
        "OUTPUT_DIR": str(tmp_path / "nb-out"),
    }
    nb = nbformat.read(ROOT / "notebooks" / "experiments.ipynb", as_version=4)
    cell = nbformat.v4.new_code_cell("# Parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(_parameters_cell_index(nb) + 1, cell)
    nb.cells.append(nbformat.v4.new_code_cell('print("PROBE", MODE, [s["status"] for s in summaries])'))
    client = NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    )
    executed = tmp_path / "executed.ipynb"
    try:
        client.execute()
    finally:
        nbformat.write(nb, executed)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs, "the notebook produced no outputs to scan"
    assert not [o for o in outputs if o.get("output_type") == "error"]
    probe = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "PROBE local ['SUCCEEDED']" in probe, probe
    hits = scan_for_secret(rel_creds, "executed notebook outputs", [executed, tmp_path / "nb-out"])
    assert not hits, hits
