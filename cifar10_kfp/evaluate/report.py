"""The evaluation report: one self-contained HTML page and a short Markdown summary (``write_outputs``
writes both, with ``metrics.json``).

The HTML page references nothing outside itself: plots are PNGs rendered with matplotlib's
Agg canvas and embedded as ``data:`` URIs, styles are inline, there is no script, and a
Content-Security-Policy meta tag makes the browser refuse anything else. Every piece of
text that comes from data (class names, parameters, dataset fields) goes through
``html.escape``. The KFP UI shows the page in a sandboxed iframe, where external
resources would not load anyway.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.evaluate.evaluation import EvalResult

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
GRID_IMAGE_PX = (
    96  # misclassified thumbnails are upscaled to this size (nearest neighbour, keeps pixels crisp)
)

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.kpi{display:inline-block;margin-right:28px}
.kpi b{display:block;font-size:1.6em}.grid{display:flex;flex-wrap:wrap;gap:10px}
.cell{width:CELL_WIDTHpx;font-size:11px;text-align:center}.cell img{image-rendering:pixelated;display:block}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}
""".replace("CELL_WIDTH", str(GRID_IMAGE_PX + 8))


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


# -------------------------------------------------------------------------------- images


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _figure_png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # Agg explicitly: no display, no global pyplot state
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def plot_history(history: list[dict]) -> bytes | None:
    """Loss and accuracy curves (train and val) per epoch; None without history."""
    from matplotlib.figure import Figure

    if not history:
        return None
    epochs = [row.get("epoch", i + 1) for i, row in enumerate(history)]
    fig = Figure(figsize=(10, 3.6))
    for ax, metric, label in zip(fig.subplots(1, 2), ("loss", "acc"), ("loss", "accuracy")):
        for split, style in (("train", "-o"), ("val", "-s")):
            values = [_as_float(row.get(f"{split}_{metric}")) for row in history]
            if any(not math.isnan(v) for v in values):
                ax.plot(epochs, values, style, markersize=3, label=f"{split} {label}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.set_title(f"{label} per epoch")
        ax.grid(alpha=0.3)
        ax.legend()
    return _figure_png(fig)


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def plot_confusion_matrix(matrix: list[list[int]], class_names: list[str]) -> bytes:
    """A heatmap of the confusion matrix, rows = true class, columns = predicted."""
    from matplotlib.figure import Figure

    counts = np.asarray(matrix)
    n = len(class_names)
    side = min(14.0, 2.5 + 0.55 * n)
    fig = Figure(figsize=(side, side * 0.85))
    ax = fig.subplots()
    row_sums = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, row_sums, out=np.zeros(counts.shape, dtype=float), where=row_sums > 0)
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of true class")
    ax.set_xticks(range(n), labels=class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), labels=class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 20:  # counts stay readable up to about 20 classes
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if shares[i, j] > 0.5 else "black")  # fmt: skip
    ax.set_title("confusion matrix (test)")
    return _figure_png(fig)


def image_png(image_chw: np.ndarray, size: int = GRID_IMAGE_PX) -> bytes:
    """A uint8 ``[3, H, W]`` image as PNG, upscaled with nearest neighbour."""
    from PIL import Image

    pil = Image.fromarray(np.ascontiguousarray(np.transpose(image_chw, (1, 2, 0))), mode="RGB")
    buf = io.BytesIO()
    pil.resize((size, size), Image.Resampling.NEAREST).save(buf, format="PNG")
    return buf.getvalue()


# -------------------------------------------------------------------------------- HTML


def _table(headers: list[str], rows: list[list], left_cols: int = 1) -> str:
    def cell(tag, i, v):
        cls = ' class="l"' if i < left_cols else ""
        return f"<{tag}{cls}>{_esc(v)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _kv_table(mapping: dict) -> str:
    if not mapping:
        return "<p>(none)</p>"
    rows = []
    for key in sorted(mapping):
        value = mapping[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True, default=str)
        rows.append([key, value])
    return _table(["name", "value"], rows, left_cols=2)


def _img(png: bytes, alt: str, width: int | None = None) -> str:
    size = f' width="{width}" height="{width}"' if width else ""
    return f'<img src="{png_data_uri(png)}" alt="{_esc(alt)}"{size}>'


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _served(result) -> str:
    return " (as served, flip TTA)" if getattr(result, "tta", False) else " (single view)"


def render_html(result: EvalResult, title: str = "Model evaluation report") -> str:
    """The full report for an ``EvalResult`` as one self-contained HTML document."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        '<div id="summary">',
        f'<div class="kpi">test accuracy{_served(result)}<b>{_pct(result.accuracy)}</b></div>',
        f'<div class="kpi">single view<b>{_pct(result.accuracy_plain)}</b></div>',
        f'<div class="kpi">test loss<b>{result.loss:.4f}</b></div>',
        f'<div class="kpi">macro F1<b>{result.macro_f1:.4f}</b></div>',
        f'<div class="kpi">test images<b>{result.num_examples}</b></div>',
        "</div>",
        '<h2 id="curves">Training curves</h2>',
    ]
    curves = plot_history(result.history)
    parts.append(
        _img(curves, "train and val loss and accuracy per epoch")
        if curves
        else "<p>No training history was provided.</p>"
    )
    parts += [
        '<h2 id="confusion">Confusion matrix</h2>',
        _img(plot_confusion_matrix(result.confusion_matrix, result.class_names), "confusion matrix heatmap"),
        '<h2 id="per-class">Per-class metrics</h2>',
        _table(
            ["class", "precision", "recall", "F1", "support"],
            [
                [name, f"{m['precision']:.4f}", f"{m['recall']:.4f}", f"{m['f1']:.4f}", m["support"]]
                for name, m in result.per_class.items()
            ],
        ),
        '<h2 id="misclassified">Misclassified test images</h2>',
        _misclassified_grid(result),
        '<h2 id="attribution">Attribution maps</h2>',
        _attribution_section(result),
        '<h2 id="parameters">Run parameters</h2>',
        _kv_table(result.params),
        '<h2 id="model">Model</h2>',
        _kv_table(result.model_summary),
        '<h2 id="dataset">Dataset</h2>',
        _kv_table(result.dataset_summary),
        "</body></html>",
    ]
    return "\n".join(parts)


def _misclassified_grid(result) -> str:
    images = result.misclassified_images
    if images is None or not len(result.misclassified):
        return "<p>No misclassified test images.</p>"
    cells = []
    for item, image in zip(result.misclassified, images):
        caption = f"true: {item['true']} / predicted: {item['predicted']} ({100 * item['confidence']:.0f}%)"
        cells.append(
            f'<div class="cell">{_img(image_png(image), caption, GRID_IMAGE_PX)}'
            f"true: <b>{_esc(item['true'])}</b><br>predicted: <b>{_esc(item['predicted'])}</b>"
            f"<br>{100 * item['confidence']:.0f}% · #{item['index']}</div>"
        )
    shown = len(cells)
    errors = result.num_examples - sum(row[i] for i, row in enumerate(result.confusion_matrix))
    return f'<p>{shown} of {errors} errors, spread over the true classes.</p><div class="grid">{"".join(cells)}</div>'


def _attribution_section(result) -> str:
    grid = getattr(result, "attribution", None)
    if grid is None:
        return f"<p>{_esc(getattr(result, 'attribution_note', '') or 'No attribution maps.')}</p>"
    from cifar10_kfp.evaluate.attribution import plot_attribution_grid

    right = sum(grid.correct)
    alt = "attribution maps: " + "; ".join(
        f"true {t}, predicted {p}" for t, p in zip(grid.true, grid.predicted)
    )
    return (
        f"<p>{_esc(grid.method)}. One row per true class: up to {grid.per_class} correctly classified images "
        f"(green titles), then up to {grid.per_class} misclassified ones (red); {right} correct and {len(grid.indices) - right} misclassified test images, "
        f"computed in {grid.seconds:.1f} s. Bright = pixels that raised the predicted class's score most.</p>"
        + _img(plot_attribution_grid(grid), alt)
    )


# ---------------------------------------------------------------------------- Markdown


def md_escape(value) -> str:
    """Escape text for a Markdown table cell (and as HTML, since the KFP UI renders Markdown to HTML)."""
    return html.escape(str(value)).replace("|", "\\|").replace("\n", " ")


def render_markdown(result: EvalResult) -> str:
    """A short summary for the KFP UI's Markdown viewer."""
    worst = sorted(result.per_class.items(), key=lambda kv: kv[1]["f1"])[:3]
    lines = [
        "# Evaluation summary",
        "",
        "| metric | value |",
        "|---|---|",
        f"| test accuracy{_served(result)} | {_pct(result.accuracy)} |",
        f"| single view (no flip) | {_pct(result.accuracy_plain)} |",
        f"| test loss | {result.loss:.4f} |",
        f"| macro F1 | {result.macro_f1:.4f} |",
        f"| test images | {result.num_examples} |",
        "",
        "Hardest classes (lowest F1): "
        + ", ".join(f"{md_escape(name)} ({m['f1']:.3f})" for name, m in worst),
    ]
    if result.model_summary:
        lines += ["", f"Model: `{md_escape(result.model_summary.get('architecture', '?'))}`"]
    digest = result.dataset_summary.get("source_digest")
    if digest:
        lines += ["", f"Dataset digest: `{md_escape(digest)}`"]
    return "\n".join(lines) + "\n"


def write_outputs(result: EvalResult, output_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``metrics.json``, ``report.html`` and ``summary.md`` into ``output_dir``; returns the paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "metrics": output_dir / "metrics.json",
        "report": output_dir / "report.html",
        "summary": output_dir / "summary.md",
    }
    paths["metrics"].write_text(json.dumps(result.metrics(), indent=2, sort_keys=True, default=str))
    paths["report"].write_text(render_html(result), encoding="utf-8")
    paths["summary"].write_text(render_markdown(result), encoding="utf-8")
    return paths
