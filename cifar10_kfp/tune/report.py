"""A study's outputs: best params, metrics, a table of the trials and an HTML report.

The report has Optuna's own matplotlib plots (optimisation history, parameter importances,
intermediate values) as embedded PNGs and one table row per trial; like the evaluation report
(``cifar10_kfp.evaluate.report``) it loads nothing from outside and has no script.
"""

from __future__ import annotations

import html
import json
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cifar10_kfp.evaluate.report import CSP, _figure_png, png_data_uri

log = logging.getLogger(__name__)

FILES = ("best_params.json", "best_training.json", "metrics.json", "trials.json", "report.html")


def trial_rows(study) -> list[dict]:
    """One dict per trial: number, state, value, params, epochs run, seconds (the fixed cost among them), which
    process ran it, and ``same_as`` (the earlier trial whose result a repeated configuration took)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        rows.append(
            {
                "number": trial.number, "state": trial.state.name, "value": trial.value, "params": trial.params,
                "epochs_run": trial.user_attrs.get("epochs_run", 0), "train_s": trial.user_attrs.get("train_s", 0.0),
                "fixed_s": trial.user_attrs.get("fixed_s", 0.0), "same_as": trial.user_attrs.get("same_as"),
                "attempt": trial.user_attrs.get("attempt", ""), "rerun_of": trial.user_attrs.get("rerun_of"),
                "device": trial.user_attrs.get("device", ""),
            }
        )  # fmt: skip
    return rows


def study_metrics(rows: list[dict], best_value: float) -> dict:
    """best_value, trials_completed, trials_pruned, trials_failed, and the compute the trials used."""
    count = lambda state: sum(row["state"] == state for row in rows)  # noqa: E731
    return {
        "best_value": float(best_value),
        "trials_completed": count("COMPLETE"),
        "trials_pruned": count("PRUNED"),
        "trials_failed": count("FAIL"),
        "trial_epochs_total": sum(int(row["epochs_run"]) for row in rows),
        "trial_seconds_total": round(sum(float(row["train_s"]) for row in rows), 3),
        "trial_fixed_seconds_total": round(sum(float(row["fixed_s"]) for row in rows), 3),
        "trials_repeated": sum(row["same_as"] is not None for row in rows),
    }


def rungs(rows: list[dict]) -> list[dict]:
    """Where trials stopped: per epoch a trial ended at, the trials pruned there and those completed there.

    Trials that took an earlier trial's result (``same_as``) trained nothing and are left out.
    """
    out: dict[int, dict] = {}
    for row in rows:
        if row["same_as"] is not None or row["state"] not in ("COMPLETE", "PRUNED"):
            continue
        at = out.setdefault(
            int(row["epochs_run"]), {"epoch": int(row["epochs_run"]), "pruned": [], "completed": []}
        )
        at["pruned" if row["state"] == "PRUNED" else "completed"].append(row["number"])
    return [out[epoch] for epoch in sorted(out)]


def _rungs_html(rows: list[dict]) -> str:
    """The rungs table: which trials stopped after which epoch, and how many trained at least that far."""
    trained = [row for row in rows if row["same_as"] is None and row["state"] in ("COMPLETE", "PRUNED")]
    lines = []
    for rung in rungs(rows):
        reached = sum(int(row["epochs_run"]) >= rung["epoch"] for row in trained)
        names = lambda numbers: ", ".join(f"#{n}" for n in numbers) or "-"  # noqa: E731
        lines.append(f"<tr><td>{rung['epoch']}</td><td>{reached}</td><td>{html.escape(names(rung['pruned']))}</td>"
                     f"<td>{html.escape(names(rung['completed']))}</td></tr>")  # fmt: skip
    return (
        "<h2>Rungs: where trials stopped</h2><table border=1 cellpadding=3><tr><th>after epoch</th>"
        "<th>trials that trained this far</th><th>stopped here (pruned)</th><th>completed here</th></tr>"
        + "".join(lines)
        + "</table>"
    )


def _plots(study) -> list[tuple[str, bytes | str]]:
    """(title, PNG) per Optuna plot, or (title, why it is missing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as ovm

    out: list[tuple[str, bytes | str]] = []
    for title, plot in (
        ("Optimisation history", ovm.plot_optimization_history),
        ("Parameter importances", ovm.plot_param_importances),
        ("Intermediate values (validation accuracy per epoch)", ovm.plot_intermediate_values),
    ):
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                # an Axes, or an array of them for several parameters (Optuna annotates only the first)
                axes: Any = plot(study=study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            out.append((title, _figure_png(figure)))
            plt.close(figure)
        except (
            ValueError,
            RuntimeError,
            ZeroDivisionError,
        ) as exc:  # e.g. importances need 2+ complete trials
            out.append((title, f"not available: {exc}"))
    return out


def render_html(study, rows: list[dict], metrics: dict, best_params: dict) -> str:
    esc = lambda value: html.escape(str(value), quote=True)  # noqa: E731
    names = sorted({name for row in rows for name in row["params"]})
    head = "".join(
        f"<th>{esc(n)}</th>"
        for n in ("#", "state", "val_acc", *names, "epochs", "seconds", "fixed seconds", "same as")
    )
    body = []
    for row in rows:
        value = "" if row["value"] is None else f"{row['value']:.4f}"
        cells = [row["number"], row["state"], value, *(row["params"].get(n, "") for n in names),
                 row["epochs_run"], row["train_s"], row["fixed_s"],
                 "" if row["same_as"] is None else f"#{row['same_as']}"]  # fmt: skip
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    figures = []
    for title, png in _plots(study):
        inner = f'<img alt="{esc(title)}" src="{png_data_uri(png)}">' if isinstance(png, bytes) else esc(png)
        figures.append(f"<h2>{esc(title)}</h2>{inner}")
    kpis = " ".join(f"<b>{esc(k)}</b>: {esc(v)}" for k, v in metrics.items())
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
        f'content="{CSP}"><title>cifar10-tune study</title></head><body style="font-family:sans-serif">'
        f"<h1>Optuna study</h1><p>{kpis}</p><p>best params: <code>{esc(json.dumps(best_params))}</code></p>"
        + _rungs_html(rows)
        + "".join(figures)
        + f"<h2>Trials</h2><table border=1 cellpadding=3><tr>{head}</tr>{''.join(body)}</table></body></html>"
    )


@dataclass
class TuneResult:
    """What a study found; ``best_training`` is the train step's settings dict for the best trial."""

    best_params: dict
    best_value: float
    best_training: dict
    metrics: dict
    trials: list[dict] = field(default_factory=list)
    output_dir: Path = field(default_factory=Path)


def write_outputs(study, values: Mapping[str, Any], output_dir: Path, training_with: Callable):
    """Write ``FILES`` to ``output_dir``; the ``TuneResult``. Raises if no trial completed."""
    from cifar10_kfp.params import table as params

    rows = trial_rows(study)
    if not any(row["state"] == "COMPLETE" for row in rows):
        states = ", ".join(f"{row['number']}: {row['state']}" for row in rows) or "none ran"
        raise RuntimeError(
            f"no trial completed ({states}): widen the search space, or raise timeout_s/n_trials"
        )
    best = study.best_trial
    metrics = study_metrics(rows, best.value)
    best_training = training_with(params.training_settings(values), best.params)
    outputs = {"best_params.json": best.params, "best_training.json": best_training, "metrics.json": metrics,
               "trials.json": rows}  # fmt: skip
    for name, payload in outputs.items():
        (output_dir / name).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    (output_dir / "report.html").write_text(render_html(study, rows, metrics, best.params))
    log.info(
        "study: best val_acc %.4f with %s (%s)", best.value, json.dumps(best.params), json.dumps(metrics)
    )
    return TuneResult(best.params, float(best.value), best_training, metrics, rows, output_dir)
