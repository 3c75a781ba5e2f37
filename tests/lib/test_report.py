"""The HTML report is self-contained, escapes data text, and renders without broken images in Chromium."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from cifar10_kfp.evaluate import evaluate_loaded
from cifar10_kfp.report import render_html, render_markdown
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
    for section in ("curves", "confusion", "per-class", "misclassified", "attribution", "parameters", "dataset"):
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

_CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_PROBE = (
    "<script>window.addEventListener('load',()=>{for(const i of document.images){"
    "i.setAttribute('data-natural-width',String(i.naturalWidth));"
    "i.setAttribute('data-complete',String(i.complete));}"
    "document.body.setAttribute('data-probed','yes');});</script>"
)


def _render_dom(page: str, tmp_path) -> list[dict]:
    """Load ``page`` in headless Chromium with an image probe added; return the probed img attributes.

    The probe needs an inline script, so only this copy's CSP also allows ``script-src 'unsafe-inline'``;
    images stay limited to ``data:`` exactly as in the real report.
    """
    probed = page.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';", 1)
    probed = probed.replace("</body>", _PROBE + "</body>")
    path = tmp_path / "probed.html"
    path.write_text(probed, encoding="utf-8")
    cmd = [
        _CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", "--dump-dom",
        path.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    parser = _Collector()
    parser.feed(done.stdout)
    body = [attrs for tag, attrs in parser.tags if tag == "body"]
    assert body and body[0].get("data-probed") == "yes", "the probe did not run: " + done.stdout[:300]
    return [attrs for tag, attrs in parser.tags if tag == "img"]


@pytest.mark.skipif(_CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_report_renders_in_chromium_without_broken_images(result, tmp_path):
    page = render_html(result)
    images = _render_dom(page, tmp_path)
    assert len(images) == 4
    for attrs in images:
        assert attrs["data-complete"] == "true"
        assert int(attrs["data-natural-width"]) > 0, attrs.get("alt")

    # The probe can fail: a corrupt data URI and an external image (blocked by the CSP) read as broken.
    broken = page.replace("</body>", '<img alt="corrupt" src="data:image/png;base64,AAAA">'
                          '<img alt="external" src="https://example.com/x.png"></body>')  # fmt: skip
    images = {a["alt"]: a for a in _render_dom(broken, tmp_path)}
    assert images["corrupt"]["data-natural-width"] == "0"
    assert images["external"]["data-natural-width"] == "0"
    assert np.count_nonzero([int(a["data-natural-width"]) > 0 for a in images.values()]) == 4
