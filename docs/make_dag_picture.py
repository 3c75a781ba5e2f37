"""Draw a compiled pipeline's DAG as a picture, from the compiled YAML alone.

    python3 docs/make_dag_picture.py                       # pipelines/compiled/cifar10-training.yaml
    python3 docs/make_dag_picture.py --spec pipelines/compiled/cifar10-tune.yaml --output docs/tune.png

It reads the IR that KFP runs (tasks, their dependencies, conditions, exit handler, caching and GPU
requests), never the Python that produced it, so the picture shows what a cluster will execute. It writes
Graphviz source next to the picture (`.dot`, compared with a fresh rendering of the YAML by
tests/test_front_page.py, so a recompiled pipeline with a stale picture fails the tests) and renders it
with Graphviz's `dot` (Debian: `apt-get install graphviz`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "pipelines" / "compiled" / "cifar10-training.yaml"
DEFAULT_OUTPUT = ROOT / "docs" / "pipeline-dag.png"

# KFP writes a condition over its own channel names; the picture shows the pipeline parameter or task output.
_CHANNEL = re.compile(r"inputs\.parameter_values\['pipelinechannel--([A-Za-z0-9_-]+)'\]")


def _condition_label(condition: str) -> str:
    text = _CHANNEL.sub(lambda m: m.group(1), condition)
    text = re.sub(r"\bint\(([A-Za-z0-9_-]+)\)", r"\1", text)
    text = re.sub(r"^!\((.*)\)$", r"not (\1)", text)
    return "if " + text.replace("-passed == true", " passed")


def _quote(text: str) -> str:
    return '"' + text.replace('"', '\\"').replace("\n", "\\n") + '"'


def _reaches(tasks: dict, start: str, target: str) -> bool:
    """Whether `start` depends on `target`, directly or through other tasks of the same DAG."""
    pending, seen = list(tasks[start].get("dependentTasks", [])), set()
    while pending:
        current = pending.pop()
        if current == target:
            return True
        if current not in seen:
            seen.add(current)
            pending.extend(tasks[current].get("dependentTasks", []))
    return False


class _Drawer:
    """Walks the IR's nested DAGs; a sub-DAG (condition, branches, exit handler) becomes a cluster."""

    def __init__(self, spec: dict) -> None:
        self.components: dict = spec["components"]
        self.executors: dict = spec["deploymentSpec"]["executors"]
        self.lines: list[str] = []
        self.clusters = 0

    def _is_dag(self, task: dict) -> bool:
        return "dag" in self.components[task["componentRef"]["name"]]

    def _leaf_label(self, task_id: str, task: dict) -> tuple[str, str]:
        component = self.components[task["componentRef"]["name"]]
        resources = self.executors[component["executorLabel"]]["container"].get("resources", {})
        notes = []
        if "accelerator" in resources:
            notes.append("GPU")
        if task.get("cachingOptions", {}).get("enableCache"):
            notes.append("cached")
        label = task.get("taskInfo", {}).get("name", task_id)
        fill = "#f6d8a8" if "GPU" in notes else "#dbe8f6"
        return (label + (f"\n({', '.join(notes)})" if notes else "")), fill

    def _cluster_label(self, task: dict) -> str:
        condition = task.get("triggerPolicy", {}).get("condition")
        if condition:
            return _condition_label(condition)
        name = task["componentRef"]["name"]
        if name.startswith("comp-exit-handler"):
            return "exit handler: its tasks, then the summary whatever happened"
        if name.startswith("comp-condition-branches"):
            return "one branch runs"
        return name.removeprefix("comp-")

    def draw(self, dag: dict, prefix: str, indent: str) -> dict[str, tuple[str, str, str | None]]:
        """Emit the tasks of one DAG; return, per task, its (first node, last node, cluster or None)."""
        ends: dict[str, tuple[str, str, str | None]] = {}
        tasks: dict = dag["tasks"]
        for task_id in sorted(tasks, key=lambda t: (len(tasks[t].get("dependentTasks", [])), t)):
            task = tasks[task_id]
            node = f"{prefix}{task_id}"
            if not self._is_dag(task):
                label, fill = self._leaf_label(task_id, task)
                self.lines.append(
                    f"{indent}{_quote(node)} [label={_quote(label)}, fillcolor={_quote(fill)}];"
                )
                ends[task_id] = (node, node, None)
                continue
            self.clusters += 1
            cluster = f"cluster_{self.clusters}"
            self.lines.append(f"{indent}subgraph {cluster} {{")
            self.lines.append(f"{indent}  label={_quote(self._cluster_label(task))};")
            inner_dag = self.components[task["componentRef"]["name"]]["dag"]
            inner = self.draw(inner_dag, node + "/", indent + "  ")
            self.lines.append(f"{indent}}}")
            depended = {d for t in inner_dag["tasks"].values() for d in t.get("dependentTasks", [])}
            first = sorted(t for t, v in inner_dag["tasks"].items() if not v.get("dependentTasks"))[0]
            last = sorted(t for t in inner_dag["tasks"] if t not in depended)[-1]
            ends[task_id] = (inner[first][0], inner[last][1], cluster)
        for task_id, task in tasks.items():
            self._edges(task_id, task, tasks, ends, indent)
        return ends

    def _edges(self, task_id: str, task: dict, tasks: dict, ends: dict, indent: str) -> None:
        always = task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
        deps = task.get("dependentTasks", [])
        # Only the direct dependencies are drawn: an edge implied by a longer path would only add clutter.
        for dep in [d for d in deps if not any(_reaches(tasks, other, d) for other in deps if other != d)]:
            _, tail, tail_cluster = ends[dep]
            head, _, head_cluster = ends[task_id]
            attrs = []
            if tail_cluster:
                attrs.append(f"ltail={tail_cluster}")
            if head_cluster:
                attrs.append(f"lhead={head_cluster}")
            if always:
                attrs += ["style=dashed", 'label="always"']
            suffix = f" [{', '.join(attrs)}]" if attrs else ""
            self.lines.append(f"{indent}{_quote(tail)} -> {_quote(head)}{suffix};")


def dag_source(spec_path: Path) -> str:
    """The Graphviz source of a compiled pipeline's DAG."""
    spec = next(yaml.safe_load_all(spec_path.read_text()))
    drawer = _Drawer(spec)
    drawer.draw(spec["root"]["dag"], "", "  ")
    title = spec["pipelineInfo"]["name"] + f" (drawn from {spec_path.name})"
    header = [
        "digraph pipeline {",
        "  compound=true; rankdir=TB; nodesep=0.3; ranksep=0.35;",
        f"  label={_quote(title)}; labelloc=t; fontname=Helvetica; fontsize=16;",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=12];',
        "  edge [fontname=Helvetica, fontsize=10];",
        '  graph [style="rounded,dashed", fontname=Helvetica, fontsize=11];',
    ]
    return "\n".join(header + drawer.lines + ["}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="compiled pipeline YAML")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="picture (.png or .svg)")
    args = parser.parse_args(argv)
    source = dag_source(args.spec)
    args.output.with_suffix(".dot").write_text(source)
    dot = shutil.which("dot")
    if dot is None:
        print(
            "make_dag_picture: Graphviz's `dot` is not installed (apt-get install graphviz)", file=sys.stderr
        )
        return 1
    fmt = args.output.suffix.lstrip(".")
    extra = ["-Gdpi=110"] if fmt == "png" else []
    subprocess.run([dot, f"-T{fmt}", *extra, "-o", str(args.output)], input=source, text=True, check=True)
    print(f"wrote {args.output} and {args.output.with_suffix('.dot')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
