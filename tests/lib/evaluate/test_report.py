"""The HTML report is self-contained, escapes data text, and renders without broken images in Chromium."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from cifar10_kfp.evaluate.evaluation import evaluate_loaded
from cifar10_kfp.evaluate.report import render_html, render_markdown
from tests.support.browser import CHROMIUM, SKIP_REASON, Chromium
from tests.support.models import lookup_case

HOSTILE = '<img src="https://evil.example/x.png" onerror="alert(1)">'


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture
def result():
    model, info, images, labels = lookup_case()
    info.class_names = ["a", "b|pipe", HOSTILE]
    # single view: two misclassified images for the grid (flip TTA rescues one of them)
    result = evaluate_loaded(model, info, images, labels, info.class_names, tta=False, device="cpu")
    result.history = [
        {"epoch": 1, "train_loss": 1.2, "train_acc": 0.4, "val_loss": 1.3, "val_acc": 0.35},
        {"epoch": 2, "train_loss": 0.8, "train_acc": 0.7, "val_loss": 0.9, "val_acc": 0.6},
        {"epoch": 3, "train_loss": 0.5, "train_acc": 0.85, "val_loss": None, "val_acc": None},  # no val split
    ]
    result.params = {"source_uri": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "note": HOSTILE}
    result.dataset_summary = {"source_digest": "ab" * 32, "sizes": {"train": 10, "val": 0, "test": 6}}
    return result


def test_report_is_self_contained_and_has_the_plots_and_grid(result):
    page = render_html(result)
    parser = _Collector()
    parser.feed(page)
    tags = [tag for tag, _ in parser.tags]
    for forbidden in ("script", "link", "iframe", "object", "embed", "base", "form"):
        assert forbidden not in tags
    assert not any("href" in attrs or "srcset" in attrs for _, attrs in parser.tags)
    assert "url(" not in page and "@import" not in page
    csp = [a for t, a in parser.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and csp[0]["content"].startswith("default-src 'none'")

    images = [attrs for tag, attrs in parser.tags if tag == "img"]
    assert len(images) == 2 + len(result.misclassified) == 4  # curves, heatmap, two misclassified
    for attrs in images:
        assert attrs["src"].startswith("data:image/png;base64,")
        png = Image.open(io.BytesIO(base64.b64decode(attrs["src"].split(",", 1)[1])))
        png.verify()
        assert png.size[0] > 0
    alts = [attrs["alt"] for attrs in images]
    assert "train and val loss and accuracy per epoch" in alts and "confusion matrix heatmap" in alts
    assert "true: a / predicted: b|pipe (" in alts[2]
    for section in (
        "curves",
        "confusion",
        "per-class",
        "misclassified",
        "attribution",
        "parameters",
        "dataset",
    ):
        assert f'id="{section}"' in page


def test_report_escapes_all_text_from_data(result):
    page = render_html(result)
    assert HOSTILE not in page
    assert "&lt;img src=&quot;https://evil.example/x.png&quot; onerror=&quot;alert(1)&quot;&gt;" in page
    # Only our data: URIs are attribute values; the hostile URL exists only as escaped text.
    parser = _Collector()
    parser.feed(page)
    assert not any("onerror" in attrs for _, attrs in parser.tags)

    summary = render_markdown(result)
    assert HOSTILE not in summary and "b\\|pipe" in summary
    assert "| test accuracy (single view) | 66.67% |" in summary


def test_report_headline_is_the_served_accuracy():
    model, info, images, labels = lookup_case()
    served = evaluate_loaded(model, info, images, labels, info.class_names, device="cpu")
    summary = render_markdown(served)
    assert "| test accuracy (as served, flip TTA) | 83.33% |" in summary
    assert "| single view (no flip) | 66.67% |" in summary
    assert "test accuracy (as served, flip TTA)<b>83.33%</b>" in render_html(served)


def test_report_without_history_or_errors(result):
    result.history = []
    result.misclassified = []
    result.misclassified_images = None
    page = render_html(result)
    assert "No training history was provided." in page and "No misclassified test images." in page


# ----------------------------------------------------------------------------- Chromium

# A real browser (tests/support/browser.py): the page as a person sees it, unmodified.
FACTS = {
    "attribution_heading": "document.querySelector('h2#attribution')?.textContent ?? ''",
    "attribution_images": "document.querySelectorAll('h2#attribution + p + img').length",
    "text_length": "document.body.innerText.length",
    "page_height": "document.documentElement.scrollHeight",
}


def _screenshot_is_not_blank(png: bytes) -> None:
    shot = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert shot.shape[0] > 900 and shot.shape[1] >= 1000, shot.shape  # the full page, not the viewport only
    flat = shot.reshape(-1, 3)
    background = np.all(flat == flat[0], axis=1).mean()
    assert background < 0.95, f"the screenshot is {background:.0%} one colour"
    assert len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0)) > 50  # plots, images, text


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_generated_report_in_a_real_browser(trained_model_dir, tiny_dataset_path, tmp_path):
    from cifar10_kfp.evaluate import evaluate_model, write_outputs

    evaluated = evaluate_model(trained_model_dir, tiny_dataset_path, device="cpu")  # history.json next to it
    assert evaluated.attribution is not None
    report = write_outputs(evaluated, tmp_path / "eval")["report"]
    with Chromium(tmp_path / "chromium-profile") as browser:
        seen = browser.inspect(report.as_uri(), FACTS)
        # The checks can fail: a corrupt image, an external image (refused by the CSP) and a script.
        broken = tmp_path / "broken.html"
        broken.write_text(report.read_text().replace("</body>", '<img alt="corrupt" src="data:image/png;base64,'
                          'AAAA"><img alt="external" src="https://example.invalid/x.png">'
                          "<script>console.error('boom')</script></body>"))  # fmt: skip
        spoiled = browser.inspect(broken.as_uri())

    assert seen.errors == []
    assert len(seen.images) == 3 + len(evaluated.misclassified)  # curves, heatmap, attribution grid, errors
    for image in seen.images:
        assert image["complete"] and image["naturalWidth"] > 0 and image["naturalHeight"] > 0, image["alt"]
    assert seen.facts["attribution_heading"] == "Attribution maps" and seen.facts["attribution_images"] == 1
    assert seen.facts["text_length"] > 500
    _screenshot_is_not_blank(seen.screenshot_png)

    widths = {image["alt"]: image["naturalWidth"] for image in spoiled.images}
    assert widths["corrupt"] == 0 and widths["external"] == 0
    assert any("Content Security Policy" in error for error in spoiled.errors), spoiled.errors
