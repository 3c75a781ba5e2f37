"""Part 7: a tampered checkpoint is refused, and a malicious one never runs its payload.

A genuine checkpoint is written by a real ``cifar10-kfp train`` run; copies of it are then
damaged in the object store and the same training command is pointed at them.

* One flipped byte, re-uploaded by someone who also fixed the store's own checksum metadata:
  the sha256 in ``latest.json`` refuses it. (With the store metadata left alone, the store's
  download check refuses it first.)
* A checkpoint whose pickle would run a command on load, with a pointer whose sha256 matches:
  ``torch.load(weights_only=True)`` refuses it, and the command never runs (marker file).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
from pathlib import Path

import pytest
import torch

from cifar10_kfp.checkpoint import CheckpointManager, checkpoint_name
from cifar10_kfp.storage import IntegrityError, join_uri, parse_uri
from tests.reliability.harness import FIGURES, ROOT, Proc, scan_for_secret
from tests.reliability.training import train_argv

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

KIND = "tampered checkpoints"


@pytest.fixture(scope="module")
def genuine(rel_server, train_data, tmp_path_factory):
    """A real two-epoch run's checkpoint prefix in the suite's store."""
    base = tmp_path_factory.mktemp("genuine")
    uri = f"s3://{rel_server.bucket}/rel-tamper/genuine"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIO_", "CIFAR10_KFP_"))}
    env.update({**rel_server.env(), "CIFAR10_KFP_PREFIX": "rel-tamper/", "CUDA_VISIBLE_DEVICES": ""})
    proc = Proc(train_argv(train_data, uri, base / "out", epochs=2), env=env, log_path=base / "train.log")
    assert proc.wait(180) == 0, proc.output()[-3000:]
    return uri


def _copy_prefix(store, src: str, dst: str) -> None:
    for uri in store.list(src + "/"):
        store.put_bytes(store.get_bytes(uri), join_uri(dst, uri[len(src) + 1 :]))


def _resume(argv_uri: str, train_data: Path, env: dict, tmp_path: Path, name: str) -> tuple[int, str, Proc]:
    proc = Proc(
        train_argv(train_data, argv_uri, tmp_path / name, epochs=3),
        env=env,
        log_path=tmp_path / f"{name}.log",
    )
    return proc.wait(120), proc.output(), proc


def _started_training(output: str) -> bool:
    return bool(re.search(r"^\s+\d+/3\s", output, re.M))


def test_flipped_byte_is_refused_by_sha256(
    genuine, rel_server, rel_env, rel_store, train_data, tmp_path, rel_creds
):
    store = rel_store
    uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}flipped"
    _copy_prefix(store, genuine, uri)
    manager = CheckpointManager(uri, store=store)
    pointer = manager.read_pointer()
    target = join_uri(uri, pointer["key"])
    data = bytearray(store.get_bytes(target))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(bytes(data), target)  # the attacker also updates the store's checksum metadata

    with pytest.raises(IntegrityError, match="sha256") as err:
        manager.load_latest()
    assert pointer["sha256"] in str(err.value)
    code, output, proc = _resume(uri, train_data, rel_env, tmp_path, "flipped")
    refused = code != 0 and "sha256" in output and "refusing" in output and not _started_training(output)
    FIGURES.record_rejection(KIND, refused)
    assert refused, f"training did not refuse the corrupted checkpoint ({code}):\n{output[-3000:]}"
    assert manager.read_pointer() == pointer, "the refused run moved the checkpoint pointer"
    assert not scan_for_secret(rel_creds, "training logs", [proc.log_path])


def test_flipped_byte_with_stale_store_checksum_is_refused(genuine, rel_server, rel_env, rel_store):
    store = rel_store
    uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}bitrot"
    _copy_prefix(store, genuine, uri)
    manager = CheckpointManager(uri, store=store)
    target = join_uri(uri, manager.read_pointer()["key"])
    loc = parse_uri(target)
    recorded = store.stat(target).sha256
    data = bytearray(store.get_bytes(target))
    data[100] ^= 0x80
    # Bit rot: the content changes under the checksum recorded at upload.
    store.client.put_object(
        loc.bucket, loc.key, io.BytesIO(bytes(data)), len(data), metadata={"sha256": recorded}
    )
    rejected = False
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        try:
            manager.load_latest()
        except IntegrityError:
            rejected = True
            raise
    FIGURES.record_rejection(KIND, rejected)


class RunsCommand:
    """Unpickling this runs ``touch <marker>``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_malicious_checkpoint(store, uri: str, marker: Path) -> None:
    state = {"format_version": 1, "epoch": 1, "step": 64, "model": RunsCommand(marker), "history": []}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    digest = store.put_bytes(data, join_uri(uri, checkpoint_name(1)))
    pointer = {"key": checkpoint_name(1), "sha256": digest, "epoch": 1, "step": 64, "size": len(data)}
    store.put_bytes(json.dumps(pointer).encode(), join_uri(uri, "latest.json"))


def test_pickle_payload_is_refused_and_never_runs(
    rel_server, rel_env, rel_store, train_data, tmp_path, rel_creds
):
    marker = tmp_path / "payload-ran"
    uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}malicious"
    _plant_malicious_checkpoint(rel_store, uri, marker)

    with pytest.raises(IntegrityError, match="not a loadable checkpoint"):
        CheckpointManager(uri, store=rel_store).load_latest()
    assert not marker.exists(), "the checkpoint's pickle payload ran in-process"

    code, output, proc = _resume(uri, train_data, rel_env, tmp_path, "malicious")
    refused = code != 0 and "not a loadable checkpoint" in output and not _started_training(output)
    FIGURES.record_rejection(KIND, refused and not marker.exists())
    assert not marker.exists(), "the checkpoint's pickle payload ran in the training process"
    assert refused, f"training did not refuse the malicious checkpoint ({code}):\n{output[-3000:]}"
    assert not scan_for_secret(rel_creds, "training logs", [proc.log_path])


def _unsafe_loads(tree: ast.AST) -> list[str]:
    """``torch.load`` calls without ``weights_only=True`` and plain ``pickle.load(s)`` calls."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        if (owner, node.func.attr) == ("torch", "load"):
            safe = any(
                kw.arg == "weights_only" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in node.keywords
            )
            if not safe:
                found.append(f"line {node.lineno}: torch.load without weights_only=True")
        elif owner in ("pickle", "_pickle", "cPickle") and node.func.attr in ("load", "loads"):
            found.append(f"line {node.lineno}: {owner}.{node.func.attr} (unrestricted unpickling)")
    return found


def test_every_torch_load_in_the_product_is_weights_only():
    """The static side of the same rule: no ``torch.load`` without ``weights_only=True``, no bare pickle."""
    offenders = []
    for folder in ("cifar10_kfp", "components", "pipelines"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for problem in _unsafe_loads(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(ROOT)} {problem}")
    assert not offenders, offenders
