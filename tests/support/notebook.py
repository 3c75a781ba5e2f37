"""Run notebooks/experiments.ipynb the way papermill does, and read back what its kernel computed.

The values to use are injected as a new cell right after the ``parameters``-tagged cell; a probe cell
appended after the last one prints the kernel's results as one JSON line. Shared by the notebook's
local end-to-end test and its cluster test (tests/cluster/test_kfp_real_run.py).
"""

from __future__ import annotations

import json
import pathlib

import nbformat

from tests.support.paths import ROOT

NOTEBOOK = ROOT / "notebooks" / "experiments.ipynb"
# Appended after the notebook's last cell: what the tests assert on, read from the kernel's state.
PROBE = """
import json as _json
print("PROBE " + _json.dumps({
    "mode": MODE,
    "statuses": [s["status"] for s in summaries],
    "errors": [s.get("error", "") for s in summaries],
    "runs": runs.reset_index().to_dict(orient="list"),
    "history_epochs": {k: v["epoch"].tolist() for k, v in histories.items()},
    "per_class_shape": list(per_class_accuracy.shape),
    "per_class_min": float(per_class_accuracy.min().min()),
    "per_class_max": float(per_class_accuracy.max().max()),
    "shown": shown,
    "n_predicted": int(len(predicted)),
    "classes": preprocess.class_names,
    "store_stopped": globals().get("embedded") is None or not embedded.running,  # cluster mode: none
}, default=str))
"""


def load() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def parameters_cell_index(nb) -> int:
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged 'parameters' (papermill convention)"
    return tagged[0]


def inject_parameters(nb, values: dict) -> None:
    """Papermill's way: a new cell right after the parameters cell, tagged injected-parameters."""
    source = "# Parameters\n" + "\n".join(f"{name} = {value!r}" for name, value in values.items())
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(parameters_cell_index(nb) + 1, cell)


def execute(
    values: dict, keep_as: pathlib.Path, *, cell_timeout_s: int = 900, env: dict | None = None
) -> tuple[nbformat.NotebookNode, dict]:
    """Run the notebook with ``values`` injected; returns the executed notebook and the probe's result.

    The executed notebook is written to ``keep_as`` (also after a failure) for a look afterwards.
    ``env`` is the kernel's whole environment (default: this process's), so a caller can run the
    notebook in a thread beside other work without changing ``os.environ``.
    """
    from nbclient import NotebookClient

    nb = load()
    inject_parameters(nb, values)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(
        nb,
        timeout=cell_timeout_s,  # per cell; a hang guard, not a speed requirement
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},  # where Jupyter would start it
    )
    try:
        client.execute(**({"env": env} if env is not None else {}))
    finally:
        nbformat.write(nb, keep_as)
    probe_output = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout")
    return nb, json.loads(probe_output.split("PROBE ", 1)[1])
