"""The README is a front page: short, showing the pipeline's picture, linking to the reference in docs/."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TRAINING_SPEC = ROOT / "pipelines" / "compiled" / "cifar10-training.yaml"
MAX_README_CHARS = 12_000
REFERENCE_DOCS = ["cli", "configuration", "results", "architecture", "pipelines", "multi-node", "evaluation",
                  "tracking"]  # fmt: skip
# [text](target) and ![alt](target); the target ends at the first closing parenthesis or space.
_LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")


def _links() -> list[tuple[bool, str]]:
    return [(bang == "!", target) for bang, target in _LINK.findall(README.read_text())]


def _dag_picture_module():
    spec = importlib.util.spec_from_file_location("make_dag_picture", ROOT / "docs" / "make_dag_picture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leaf_tasks(spec: dict, dag: dict) -> set[str]:
    leaves = set()
    for task_id, task in dag["tasks"].items():
        component = spec["components"][task["componentRef"]["name"]]
        leaves |= _leaf_tasks(spec, component["dag"]) if "dag" in component else {task_id}
    return leaves


def test_readme_is_at_most_12000_characters():
    size = len(README.read_text())
    assert size <= MAX_README_CHARS, (
        f"README.md has {size} characters, over {MAX_README_CHARS}: move detail to docs/"
    )


def test_readme_shows_the_pipeline_picture_and_it_exists():
    pictures = [target for is_image, target in _links() if is_image]
    assert pictures, "README.md shows no picture"
    assert pictures[0] in ("docs/pipeline-dag.png", "docs/pipeline-dag.svg"), pictures
    picture = ROOT / pictures[0]
    assert picture.is_file() and picture.stat().st_size > 1000, f"{picture} is missing or empty"


def test_every_relative_link_of_the_readme_exists():
    missing = [t for _, t in _links() if "://" not in t and not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_reference_docs_exist_and_the_readme_links_them():
    targets = {t for _, t in _links()}
    for name in REFERENCE_DOCS:
        assert (ROOT / "docs" / f"{name}.md").is_file(), f"docs/{name}.md is missing"
        assert f"docs/{name}.md" in targets, f"README.md does not link docs/{name}.md"


def test_the_committed_picture_source_matches_the_compiled_pipeline():
    # The .dot is what the committed picture was rendered from: a recompiled pipeline whose picture was
    # not redrawn fails here (the PNG's bytes depend on the Graphviz version; the .dot does not).
    fresh = _dag_picture_module().dag_source(TRAINING_SPEC)
    committed = (ROOT / "docs" / "pipeline-dag.dot").read_text()
    assert committed == fresh, "docs/pipeline-dag.* is stale: run `python3 docs/make_dag_picture.py`"


def test_the_picture_has_every_task_of_the_compiled_pipeline():
    spec = next(yaml.safe_load_all(TRAINING_SPEC.read_text()))
    source = _dag_picture_module().dag_source(TRAINING_SPEC)
    nodes = {m.split("/")[-1] for m in re.findall(r'^\s*"([^"]+)" \[label=', source, re.M)}
    assert nodes == _leaf_tasks(spec, spec["root"]["dag"])


def test_architecture_has_one_table_row_per_stage_package():
    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(p.name for p in (ROOT / "cifar10_kfp").iterdir() if (p / "__init__.py").is_file())
    rows = re.findall(r"^\| `([a-z_]+)/` \|", text, re.M)
    assert rows == [r for r in rows if r in packages] and sorted(rows) == packages, (rows, packages)
