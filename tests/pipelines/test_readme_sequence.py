"""The README's own command sequence after a small ``run-local``, as a new user runs it (issue 26).

From a clean folder, with no object store configured and only relative paths: ``run-local`` on a
tiny image-folder archive, then ``runs --local``, ``tensorboard --no-serve``, ``predict`` by the
default model name, and the ``store --data-dir ...`` command run-local prints. A second run the gate
keeps back and a third that fails then show their reasons in the summary table and in ``runs --local``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess

import pytest

from tests.support.cli import cli, command, user_env
from tests.support.datagen import make_image_folder_archive, small_image_folder, solid_image

SMALL = ["--param", "preset=seed", "--param", "architecture=simple_cnn", "--param", "epochs=1",
         "--param", "num_gpus=0"]  # fmt: skip


def _run_local(here, *params: str):
    """``run-local`` in ``here``; its process and the rows of the summary table it ends with."""
    proc = cli(here, "run-local", *SMALL, *params, timeout=600)
    lines = proc.stdout.splitlines()
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    table = lines[rules[-2] + 1 : rules[-1]] if len(rules) >= 2 else []
    rows = dict(line.split(None, 1) for line in table if len(line.split(None, 1)) == 2)
    return proc, {key: value.strip() for key, value in rows.items()}


@pytest.mark.slow
def test_the_readme_commands_after_a_small_run_local_all_work(tmp_path):
    here = tmp_path / "clone"
    here.mkdir()
    make_image_folder_archive(here / "data.tar.gz", small_image_folder(per_class=8))  # cat and dog colours
    (here / "a.png").write_bytes(solid_image((40, 90, 0)))  # the colour of class "cat"

    first, rows = _run_local(here, "--param", "dataset_uri=data.tar.gz", "--param", "min_accuracy=0")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert rows["status"] == "SUCCEEDED" and "/models/cifar10-classifier/" in rows["published"]
    version = rows["published"].rsplit("(version ", 1)[1].rstrip(")")
    browse = re.search(r"\(browse: (cifar10-kfp store --data-dir [^)]+)\)", first.stdout)
    assert browse and browse.group(1) == "cifar10-kfp store --data-dir local_outputs/object-store"

    runs = cli(here, "runs", "--local")
    assert runs.returncode == 0, runs.stderr
    assert "SUCCEEDED" in runs.stdout and version in runs.stdout

    board = cli(here, "tensorboard", "--no-serve")
    assert board.returncode == 0, board.stderr
    assert re.search(
        r"^\d+ event file\(s\) from s3://.*/tensorboard in local_outputs/tensorboard/", board.stdout
    )
    assert list((here / "local_outputs" / "tensorboard").rglob("events.out.tfevents*"))

    predict = cli(here, "predict", "--model", "cifar10-classifier", "a.png")
    assert predict.returncode == 0, predict.stderr
    assert predict.stdout.splitlines()[0] == "a.png" and predict.stdout.splitlines()[1].split()[:2] == [
        "1.",
        "cat",
    ]

    # A run the gate keeps back (the champion it must strictly beat is the first run's model), and one
    # that fails: each says why, at the end of run-local and in runs --local.
    kept, rows = _run_local(here, "--param", "dataset_uri=data.tar.gz", "--param", "min_accuracy=1")
    assert kept.returncode == 0 and rows["status"] == "SUCCEEDED", kept.stdout[-3000:]
    assert rows["published"].startswith("no (the gate kept it back: accuracy "), rows["published"]
    files = small_image_folder(per_class=3)
    files["data/train/cat/broken.png"] = b"not a png"
    make_image_folder_archive(here / "broken.tar.gz", files)
    failed, rows = _run_local(here, "--param", "dataset_uri=broken.tar.gz")
    assert failed.returncode == 1 and rows["status"] == "FAILED"
    assert rows["published"] == "no (the run failed at step preprocess-dataset)"
    assert "cannot decode image data/train/cat/broken.png" in rows["error"] and "BytesIO" not in rows["error"]
    table = cli(here, "runs", "--local").stdout.splitlines()
    assert len(table) == 4, table  # header + 3 runs, newest first
    assert "FAILED" in table[1] and "failed at preprocess-dataset: ImageDecodeError: cannot decode image " \
        "data/train/cat/broken.png" in table[1]  # fmt: skip
    assert "not published: the gate kept it back: accuracy " in table[2]
    assert version in table[3] and table[3].rstrip().endswith("-")  # published: no note

    _serve_the_store_as_printed(here, shlex.split(browse.group(1))[1:])


def _serve_the_store_as_printed(here, args: list[str]) -> None:
    """``cifar10-kfp store --data-dir local_outputs/object-store``: it serves the runs' data, then stops."""
    from cifar10_kfp.storage import ObjectStore, StorageConfig

    server = subprocess.Popen(command(*args), cwd=here, env=user_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        exports = {}
        for line in server.stdout:
            if line.startswith("export "):
                key, _, value = line[len("export ") :].strip().partition("=")
                exports[key] = value
            if line.startswith("# data:"):
                break
        assert exports.get("MINIO_ENDPOINT"), server.stderr.read() if server.poll() is not None else exports
        store = ObjectStore(StorageConfig.from_env(exports))
        summaries = [uri for uri in store.list(store.root_uri("runs")) if uri.endswith("/summary.json")]
        assert len(summaries) == 3, summaries
        assert store.list(store.root_uri("models", "cifar10-classifier"))
        port = exports["MINIO_ENDPOINT"].rsplit(":", 1)[1]
        server.send_signal(signal.SIGTERM)  # what Ctrl-C or a service manager does
        assert server.wait(timeout=60) == 0
        assert not [
            n for n in os.listdir("/tmp") if n.startswith("seaweedfs-") and n.endswith(f"-{port}.sock")
        ]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
