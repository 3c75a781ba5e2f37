"""``cifar10-kfp runs``: recent runs with their key metrics side by side."""

from __future__ import annotations

import argparse
import json

from cifar10_kfp_pipelines.commands import common

HELP = (
    "list recent KFP runs (or, with --local, run-local runs) with their key metrics (test accuracy, "
    "published version) side by side"
)
COLUMNS = ("created", "state", "test_acc", "val_acc", "published", "name", "run id", "note")
NOTE_WIDTH = 120  # a table cell shows the first line of a note, cut here; --json has it whole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_connection_flags(parser)
    parser.add_argument("--experiment", default=None, help="only runs of this experiment")
    parser.add_argument("--limit", type=int, default=20, help="how many runs (newest first, default 20)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--local", action="store_true",
        help="runs of run-local / make run, from the run summaries in the object store (MINIO_ENDPOINT, "
        "else the embedded store's data in --data-dir)",
    )  # fmt: skip
    common.add_local_store_flag(parser, "with --local and no MINIO_ENDPOINT")


def _summary_reader(store=None):
    """``run_id -> summary or None``. Summaries live in the object store (written by each run's exit
    handler), not in the runs API, so without MINIO_* settings the metric columns stay empty."""
    import os

    if store is None and not os.environ.get("MINIO_ENDPOINT"):
        return lambda run_id: None
    from cifar10_kfp.runs import read_summary
    from cifar10_kfp.storage import ObjectStore

    store = store or ObjectStore()
    return lambda run_id: read_summary(store, run_id)


def collect(
    client, *, experiment_id: str | None, namespace: str | None, limit: int, store=None
) -> list[dict]:
    response = client.list_runs(
        experiment_id=experiment_id,
        namespace=None if experiment_id else namespace,
        page_size=limit,
        sort_by="created_at desc",
    )
    read_summary = _summary_reader(store)
    rows = []
    for run in response.runs or []:
        summary = read_summary(run.run_id) or {}
        metrics = summary.get("metrics") or {}
        published = summary.get("published") or {}
        rows.append(
            {
                "run_id": run.run_id,
                "name": run.display_name,
                "state": str(run.state or ""),
                "created": str(run.created_at or "")[:19].replace("T", " "),
                "test_accuracy": metrics.get("test_accuracy"),
                "val_acc": metrics.get("val_acc"),
                "published": published.get("version", ""),
                "note": row_note(summary),
            }
        )
    return rows


def row_note(summary: dict) -> str:
    """A failed run's step and error, or why a finished run published nothing ("" otherwise)."""
    from cifar10_kfp.runs import unpublished_reason

    if not summary:
        return ""
    if summary.get("status") == "FAILED":
        return f"failed at {summary.get('failed_task') or '?'}: {summary.get('error') or 'unknown error'}"
    reason = unpublished_reason(summary)
    return f"not published: {reason}" if reason else ""


def local_rows(store, limit: int) -> list[dict]:
    """The rows of ``collect`` for local runs: one per run summary in ``store``, newest first."""
    import time

    from cifar10_kfp.runs import recent_summaries

    rows = []
    for written, summary in recent_summaries(store, limit):
        metrics = summary.get("metrics") or {}
        rows.append(
            {
                "run_id": summary.get("run_id", ""),
                "name": summary.get("pipeline", ""),
                "state": summary.get("status", ""),
                "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(written)) if written else "",
                "test_accuracy": metrics.get("test_accuracy"),
                "val_acc": metrics.get("val_acc"),
                "published": (summary.get("published") or {}).get("version", ""),
                "note": row_note(summary),
            }
        )
    return rows


def format_table(rows: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        value = {
            "created": row["created"], "state": row["state"], "name": row["name"], "run id": row["run_id"],
            "test_acc": row["test_accuracy"], "val_acc": row["val_acc"], "published": row["published"] or "-",
            "note": _first_line(row.get("note", ""), NOTE_WIDTH),
        }[column]  # fmt: skip
        if isinstance(value, float):
            return f"{value:.4f}"
        return "-" if value is None or value == "" else str(value)

    table = [list(COLUMNS)] + [[cell(r, c) for c in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table)


def _first_line(text: str, width: int) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def run(args: argparse.Namespace) -> int:
    if args.local:
        from cifar10_kfp.storage import ObjectStore
        from cifar10_kfp_pipelines.local import object_store_env

        missing = common.missing_local_store(args.data_dir)
        if missing:
            print("[]" if args.json else f"no runs: {missing}")
            return 0
        with object_store_env(args.data_dir):
            rows = local_rows(ObjectStore(), args.limit)
        print(json.dumps(rows, indent=2) if args.json else (format_table(rows) if rows else "no runs"))
        return 0
    from cifar10_kfp_pipelines.kfp_client import explained_api_errors, make_client

    login = common.login_from_args(args)
    client = make_client(login, args.namespace)
    with explained_api_errors(login, namespace=args.namespace):
        experiment_id = None
        if args.experiment:
            experiment_id = client.get_experiment(
                experiment_name=args.experiment, namespace=args.namespace
            ).experiment_id
        rows = collect(client, experiment_id=experiment_id, namespace=args.namespace, limit=args.limit)
    print(json.dumps(rows, indent=2) if args.json else (format_table(rows) if rows else "no runs"))
    return 0
