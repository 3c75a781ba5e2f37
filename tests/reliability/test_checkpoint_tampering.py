"""Part 7: a tampered checkpoint is refused, and a malicious one never runs its payload.

Copies of the reference run's genuine checkpoints are damaged in the object store, and the
training command is pointed at them (the two refused runs go at the same time).

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
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from cifar10_kfp.storage import IntegrityError, join_uri, parse_uri
from cifar10_kfp.train.checkpoint import CheckpointManager, checkpoint_name
from tests.reliability.harness import FIGURES, ROOT, Proc, product_env, scan_for_secret
from tests.reliability.training import EPOCHS, train_argv

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

KIND = "tampered checkpoints"


class RunsCommand:
    """Unpickling this runs ``touch <marker>``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _copy_prefix(store, src: str, dst: str) -> None:
    for uri in store.list(src + "/"):
        store.put_bytes(store.get_bytes(uri), join_uri(dst, uri[len(src) + 1 :]))


def _plant_flipped_byte(store, genuine: str, uri: str) -> dict:
    """A copy of a genuine checkpoint prefix with one bit flipped in the newest checkpoint."""
    _copy_prefix(store, genuine, uri)
    pointer = CheckpointManager(uri, store=store).read_pointer()
    target = join_uri(uri, pointer["key"])
    data = bytearray(store.get_bytes(target))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(bytes(data), target)  # the attacker also updates the store's checksum metadata
    return pointer


def _plant_malicious_checkpoint(store, uri: str, marker: Path) -> None:
    """A checkpoint whose pickle runs a command, under a pointer whose sha256 matches it."""
    state = {"format_version": 1, "epoch": 1, "step": 64, "model": RunsCommand(marker), "history": []}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    digest = store.put_bytes(data, join_uri(uri, checkpoint_name(1)))
    pointer = {"key": checkpoint_name(1), "sha256": digest, "epoch": 1, "step": 64, "size": len(data)}
    store.put_bytes(json.dumps(pointer).encode(), join_uri(uri, "latest.json"))


@dataclass
class Refusal:
    uri: str
    code: int
    output: str
    log: Path

    @property
    def started_training(self) -> bool:
        return bool(re.search(rf"^\s+\d+/{EPOCHS}\s", self.output, re.M))


@pytest.fixture(scope="module")
def tampered(rel_server, reference_run, train_data, tmp_path_factory):
    """Both tampered prefixes planted, and the training command pointed at each (the two run at once)."""
    base = tmp_path_factory.mktemp("tampered")
    store = rel_server.store()
    root = f"s3://{rel_server.bucket}/rel-tamper"
    marker = base / "payload-ran"
    pointer = _plant_flipped_byte(store, reference_run.checkpoint_uri, f"{root}/flipped")
    _plant_malicious_checkpoint(store, f"{root}/malicious", marker)
    env = product_env(rel_server, "rel-tamper/")
    procs = {
        name: Proc(
            train_argv(train_data, f"{root}/{name}", base / name), env=env, log_path=base / f"{name}.log"
        )
        for name in ("flipped", "malicious")
    }
    runs = {
        name: Refusal(f"{root}/{name}", proc.wait(120), proc.output(), proc.log_path)
        for name, proc in procs.items()
    }
    return runs, pointer, marker, store


def test_flipped_byte_is_refused_by_sha256(tampered, rel_creds):
    runs, pointer, _, store = tampered
    run = runs["flipped"]
    manager = CheckpointManager(run.uri, store=store)
    with pytest.raises(IntegrityError, match="sha256") as err:
        manager.load_latest()
    assert pointer["sha256"] in str(err.value)
    refused = (
        run.code != 0 and "sha256" in run.output and "refusing" in run.output and not run.started_training
    )
    FIGURES.record_rejection(KIND, refused)
    assert refused, f"training did not refuse the corrupted checkpoint ({run.code}):\n{run.output[-3000:]}"
    assert manager.read_pointer() == pointer, "the refused run moved the checkpoint pointer"
    assert not scan_for_secret(rel_creds, "training logs", [run.log])


def test_flipped_byte_with_stale_store_checksum_is_refused(reference_run, rel_server, rel_env, rel_store):
    store = rel_store
    uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}bitrot"
    _copy_prefix(store, reference_run.checkpoint_uri, uri)
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


def test_pickle_payload_is_refused_and_never_runs(tampered, rel_creds):
    runs, _, marker, store = tampered
    run = runs["malicious"]
    assert not marker.exists(), "the checkpoint's pickle payload ran in the training process"
    with pytest.raises(IntegrityError, match="not a loadable checkpoint"):
        CheckpointManager(run.uri, store=store).load_latest()
    assert not marker.exists(), "the checkpoint's pickle payload ran in-process"
    refused = run.code != 0 and "not a loadable checkpoint" in run.output and not run.started_training
    FIGURES.record_rejection(KIND, refused)
    assert refused, f"training did not refuse the malicious checkpoint ({run.code}):\n{run.output[-3000:]}"
    assert not scan_for_secret(rel_creds, "training logs", [run.log])


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
