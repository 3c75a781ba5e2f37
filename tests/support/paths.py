"""Where the repository and the shared real dataset are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL_ARCHIVE = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
