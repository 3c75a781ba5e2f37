"""A new user's first hour (issue 26): the README's commands, run as a user runs them.

Every test runs the ``cifar10-kfp`` console script in a fresh process, from a clean working
directory, with no ``MINIO_*`` settings and relative paths, and reads what a user would read: the
exit status, the one line of an error, the files left behind. The run-local sequence itself is
tests/pipelines/test_readme_sequence.py.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from PIL import features

from tests.support.cli import cli, user_env
from tests.support.datagen import make_image_folder_archive, small_image_folder, solid_image


@pytest.fixture
def clean_dir(tmp_path) -> Path:
    here = tmp_path / "clone"
    here.mkdir()
    return here


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------ local store commands, nothing run yet


def test_local_commands_in_an_empty_folder_say_no_run_local_ran_there(clean_dir):
    runs = cli(clean_dir, "runs", "--local")
    assert runs.returncode == 0, runs.stderr
    assert runs.stdout.startswith("no runs: no local object store at ")
    assert f"{clean_dir}/local_outputs/object-store" in runs.stdout and "run-local" in runs.stdout
    assert json.loads(cli(clean_dir, "runs", "--local", "--json").stdout) == []
    board = cli(clean_dir, "tensorboard", "--no-serve")
    assert board.returncode == 2 and "no local object store at" in board.stderr, board.stderr
    image = clean_dir / "a.png"
    image.write_bytes(solid_image((200, 10, 10)))
    predict = cli(clean_dir, "predict", "--model", "cifar10-classifier", "a.png")
    assert predict.returncode == 2, predict.stderr
    assert (
        "--model 'cifar10-classifier' is not a directory and there is no local object store" in predict.stderr
    )
    assert "Traceback" not in runs.stderr + board.stderr + predict.stderr
    assert sorted(p.name for p in clean_dir.iterdir()) == ["a.png"]  # no empty store was created


def test_the_embedded_store_starts_on_a_relative_data_dir_and_leaves_nothing_in_tmp(clean_dir, monkeypatch):
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore

    monkeypatch.chdir(clean_dir)
    before = set(os.listdir("/tmp"))
    server = EmbeddedObjectStore("local_outputs/object-store")
    assert server.data_dir == clean_dir / "local_outputs" / "object-store"  # absolute once, here
    with server:
        ports = {str(port) for port in server.ports.values()}
        pid = str(server.pid)
        server.store().put_bytes(b"x", "s3://mlpipeline/x")
        sockets = [
            n for n in os.listdir("/tmp") if n.startswith("seaweedfs-") and n[:-5].rsplit("-", 1)[-1] in ports
        ]
        assert sockets, "weed made no sockets for its ports: the leftover check below would prove nothing"
    assert (clean_dir / "local_outputs" / "object-store" / "data").is_dir()
    assert not (clean_dir / "local_outputs" / "object-store" / "local_outputs").exists()
    left = set(os.listdir("/tmp")) - before
    # Other weed servers (other test sessions) may come and go meanwhile: only ours count, by its ports
    # (sockets: /tmp/seaweedfs-<service>-[grpc-]<port>.sock) and its pid (glog: weed.<host>.<user>.log.*.<pid>).
    ours = [n for n in left if (n.startswith("seaweedfs-") and n[:-5].rsplit("-", 1)[-1] in ports)
            or (n.startswith("weed.") and n.endswith("." + pid))]  # fmt: skip
    assert ours == [], ours
    assert "Volume Size Limit" in (server.log_path).read_text()  # the log went to weed.log instead


# --------------------------------------------------------------------------- unreachable cluster


def test_an_unreachable_kfp_api_is_one_line_naming_it_and_what_to_check(clean_dir):
    host = f"http://127.0.0.1:{closed_port()}"
    for args in (["runs", "--host", host], ["submit", "--host", host, "--image", "registry.example.com/x:1"]):
        proc = cli(clean_dir, *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert f"the KFP API at {host} refused the connection" in lines[0]
        assert "port-forward" in lines[0] and "kubectl config current-context" in lines[0]


def test_doctor_says_when_no_cluster_is_configured_or_it_does_not_answer(clean_dir):
    home = clean_dir / "home"
    home.mkdir()
    none = cli(clean_dir, "doctor", env=user_env(HOME=str(home), KUBECONFIG=str(home / "missing")))
    assert none.returncode == 1 and none.stderr == ""
    assert none.stdout.startswith("[FAIL] Kubernetes API: no cluster is configured: no usable kubeconfig")
    assert "TrainJob" not in none.stdout and "num_nodes" not in none.stdout
    stale = home / "kubeconfig"
    port = closed_port()
    stale.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: stale\n"
        f"clusters: [{{name: stale, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: stale, context: {cluster: stale, user: me}}]\nusers: [{name: me, user: {token: t}}]\n"
    )
    down = cli(clean_dir, "doctor", env=user_env(HOME=str(home), KUBECONFIG=str(stale)))
    assert down.returncode == 1 and down.stderr == "", down.stderr
    assert down.stdout.splitlines() == [
        f"[FAIL] Kubernetes API: https://127.0.0.1:{port} refused the connection (nothing listens there)",
        "       fix: check your kubeconfig's current context (`kubectl config current-context`, `kubectl "
        "cluster-info`): the cluster, or the tunnel or port-forward to it, must be up; or pass --kube-api URL",
    ]


# --------------------------------------------------------------------------------- image folders


def test_every_format_pillow_reads_is_accepted(clean_dir):
    files = small_image_folder(per_class=2)
    extra = {"BMP": "bmp", "GIF": "gif", "TIFF": "tif"} | ({"WEBP": "webp"} if features.check("webp") else {})
    for fmt, suffix in extra.items():
        files[f"data/train/cat/x.{suffix}"] = solid_image((40, 90, 0), fmt=fmt)
        files[f"data/test/dog/x.{suffix}"] = solid_image((190, 90, 0), fmt=fmt)
    make_image_folder_archive(clean_dir / "folder.tar.gz", files)
    proc = cli(clean_dir, "data", "--source", "folder.tar.gz", "--val-fraction", "0", "--output", "d.safetensors",
               "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["sizes"] == {"train": 4 + len(extra), "val": 0, "test": 4 + len(extra)}
    assert summary["skipped_images"] == []


def test_a_corrupt_image_fails_naming_it_unless_skipping_is_chosen(clean_dir):
    files = small_image_folder(per_class=3)
    files["data/train/cat/broken.png"] = b"this is not a png"
    make_image_folder_archive(clean_dir / "folder.tar.gz", files)
    args = ["data", "--source", "folder.tar.gz", "--val-fraction", "0", "--output", "d.safetensors"]
    fails = cli(clean_dir, *args)
    assert fails.returncode == 2
    assert fails.stderr.strip().splitlines()[-1] == (
        "cifar10-kfp data: error: cannot decode image data/train/cat/broken.png: UnidentifiedImageError: "
        "cannot identify image file"
    )
    assert not (clean_dir / "d.safetensors").exists()
    skips = cli(clean_dir, *args, "--skip-bad-images")
    assert skips.returncode == 0, skips.stderr
    assert "skipped     1 undecodable image(s) (--skip-bad-images):" in skips.stdout
    assert "data/train/cat/broken.png: cannot decode image data/train/cat/broken.png" in skips.stdout
    summary = json.loads(cli(clean_dir, *args, "--skip-bad-images", "--json").stdout)
    assert summary["sizes"]["train"] == 6 and [s["name"] for s in summary["skipped_images"]] == [
        "data/train/cat/broken.png"
    ]
    from cifar10_kfp.data.format import read_metadata

    meta = read_metadata(clean_dir / "d.safetensors")  # the stats travel with the dataset file
    assert (
        meta["skip_bad_images"] is True and meta["skipped_images"][0]["name"] == "data/train/cat/broken.png"
    )


# ------------------------------------------------------------------------------------ validation


def test_data_refuses_a_folder_source_saying_how_to_pack_it(clean_dir):
    folder = clean_dir / "my-images"
    (folder / "train" / "cat").mkdir(parents=True)
    proc = cli(clean_dir, "data", "--source", "my-images", "--output", "d.safetensors")
    assert proc.returncode == 2
    assert "dataset source 'my-images' is a folder; folders are not supported" in proc.stderr
    assert "tar czf my-images.tar.gz -C . my-images" in proc.stderr
    assert "no such file" not in proc.stderr


def test_val_fraction_has_one_rule_for_data_and_the_pipeline(clean_dir):
    make_image_folder_archive(clean_dir / "folder.tar.gz", small_image_folder(per_class=4))
    data = cli(
        clean_dir, "data", "--source", "folder.tar.gz", "--val-fraction", "0.6", "--output", "d.safetensors"
    )
    assert data.returncode == 2 and "invalid val_fraction=0.6: must be in [0, 0.5]" in data.stderr
    local = cli(clean_dir, "run-local", "--param", "val_fraction=0.6")
    assert (
        local.returncode == 2 and "val_fraction=0.6 is out of range: use a value in [0, 0.5]" in local.stderr
    )
    ok = cli(
        clean_dir, "data", "--source", "folder.tar.gz", "--val-fraction", "0.5", "--output", "d.safetensors"
    )
    assert ok.returncode == 0, ok.stderr


def test_run_local_refuses_several_nodes_and_bad_json_before_anything_runs(clean_dir):
    nodes = cli(clean_dir, "run-local", "--param", "num_nodes=2")
    assert nodes.returncode == 2
    assert "num_nodes=2 cannot run locally: run-local runs every step on this one machine" in nodes.stderr
    assert "Kubeflow Trainer TrainJob, which needs a cluster" in nodes.stderr
    bad = cli(clean_dir, "run-local", "--param", "extra_hparams={bad")
    assert bad.returncode == 2
    assert (
        "extra_hparams='{bad' is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))" in bad.stderr
    )
    assert "out of range" not in bad.stderr
    assert list(clean_dir.iterdir()) == []  # no output root, no store: nothing started


def test_a_timeout_and_a_dropped_connection_are_worded_as_such():
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError

    from cifar10_kfp_pipelines.kfp_client import unreachable_reason

    def gave_up(reason):
        return MaxRetryError(None, "/apis/v2beta1/healthz", reason)

    connect = ConnectTimeoutError(None, "Connection to 10.0.0.1 timed out. (connect timeout=15)")
    assert unreachable_reason(gave_up(connect)) == "did not answer: the connection timed out"
    assert unreachable_reason(ReadTimeoutError(None, "/x", "read timed out")) == (
        "did not answer: the connection timed out"
    )
    dropped = ProtocolError("Connection aborted.", ConnectionResetError(104, "reset by peer"))
    assert unreachable_reason(gave_up(dropped)) == "dropped the connection (Connection aborted)"
